#!/usr/bin/env bash
# The README's test command: checks what gangway's tests need, installs what it can
# (Debian packages, when run as root), stops before building with one message naming
# every missing piece otherwise, then runs the whole suite:
#
#   cargo test --workspace --locked --no-fail-fast [ARGS...]
#
# Extra arguments go to `cargo test` (e.g. `./test.sh -p gangway-raft`). What the suite needs:
#   - cargo (rustup.rs);
#   - a real Kubernetes control plane's binaries: the folder GANGWAY_K8S_ASSETS names, else
#     ../shared/k8s beside the repository (etcd, kube-apiserver, kube-controller-manager,
#     kube-scheduler, or their .xz files);
#   - xz (Debian xz-utils) when those are compressed;
#   - headless Chromium and ChromeDriver for the web view's browser test (Debian chromium,
#     chromium-driver; or GANGWAY_CHROMIUM / GANGWAY_CHROMEDRIVER naming them);
#   - root: a fail-safe test mounts a small tmpfs to fill a replica's disk;
#   - Python 3.9+ with pip, and the package registry (PyPI) for the Python client's
#     dependencies (installed here).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

K8S_VERSION=v1.36.2
ETCD_VERSION=v3.4.23
PROGRAMS=(etcd kube-apiserver kube-controller-manager kube-scheduler)

problems=()
apt_packages=()
is_root=false
[ "$(id -u)" = 0 ] && is_root=true

executable() { [ -n "$1" ] && [ -x "$1" ]; }

if ! command -v cargo >/dev/null; then
  problems+=("cargo is not on PATH: install Rust with rustup (https://rustup.rs)")
fi

# The control plane: the programs themselves, or all four .xz files.
assets="${GANGWAY_K8S_ASSETS:-$(cd .. && pwd)/shared/k8s}"
assets_kind=none
if [ -d "$assets" ]; then
  plain=true; packed=true
  for p in "${PROGRAMS[@]}"; do
    [ -f "$assets/$p" ] || plain=false
    [ -f "$assets/$p.xz" ] || packed=false
  done
  $plain && assets_kind=plain
  [ $assets_kind = none ] && $packed && assets_kind=xz
fi
if [ $assets_kind = none ]; then
  problems+=("the Kubernetes control plane's binaries: ${assets} does not hold ${PROGRAMS[*]} (nor their .xz files).
    Set GANGWAY_K8S_ASSETS to a folder holding them. The tests run Kubernetes ${K8S_VERSION} and etcd ${ETCD_VERSION}:
      kube-apiserver, kube-controller-manager, kube-scheduler: the server binaries of
        https://dl.k8s.io/${K8S_VERSION}/kubernetes-server-linux-amd64.tar.gz (kubernetes/server/bin/)
      etcd: https://github.com/etcd-io/etcd/releases/download/${ETCD_VERSION}/etcd-${ETCD_VERSION}-linux-amd64.tar.gz
        (or Debian's etcd-server package)
    A SHA256SUMS file beside .xz files is checked when they are decompressed; plain binaries are used as they are.")
fi
if [ $assets_kind = xz ] && ! command -v xz >/dev/null; then
  apt_packages+=(xz-utils)
fi

chromium="${GANGWAY_CHROMIUM:-/usr/bin/chromium}"
chromedriver="${GANGWAY_CHROMEDRIVER:-/usr/bin/chromedriver}"
if ! executable "$chromium"; then
  if [ -n "${GANGWAY_CHROMIUM:-}" ]; then
    problems+=("GANGWAY_CHROMIUM=$chromium is not an executable file")
  else
    apt_packages+=(chromium)
  fi
fi
if ! executable "$chromedriver"; then
  if [ -n "${GANGWAY_CHROMEDRIVER:-}" ]; then
    problems+=("GANGWAY_CHROMEDRIVER=$chromedriver is not an executable file")
  else
    apt_packages+=(chromium-driver)
  fi
fi

# The Python client's tests and the example framework (server/tests/python_client.rs,
# server/tests/example_job.rs) run the package installed from client/python.
python="${GANGWAY_PYTHON:-python3}"
if ! command -v "$python" >/dev/null || ! "$python" -m pip --version >/dev/null 2>&1; then
  problems+=("Python 3.9+ with pip (${python}): the Python client's tests install client/python with it (Debian python3, python3-pip)")
fi

if ! $is_root; then
  problems+=("root: server/tests/failsafe.rs mounts a 48 MiB tmpfs to fill a replica's disk; run as root (e.g. sudo -E ./test.sh)")
fi

if [ ${#apt_packages[@]} -gt 0 ]; then
  if $is_root && command -v apt-get >/dev/null && [ ${#problems[@]} -eq 0 ]; then
    echo "test.sh: installing ${apt_packages[*]} (apt-get)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_packages[@]}" >/dev/null
  else
    problems+=("Debian packages ${apt_packages[*]}: apt-get install -y ${apt_packages[*]} (as root; this script installs them itself when run as root)")
  fi
fi

if [ ${#problems[@]} -gt 0 ]; then
  {
    echo "test.sh: the tests cannot run yet; nothing was built. Missing:"
    for p in "${problems[@]}"; do echo "  - $p"; done
  } >&2
  exit 2
fi

# From PyPI: grpcio and protobuf (the client), kubernetes (the example framework); the
# client's stubs are generated from proto/ as it is built.
echo "test.sh: installing the Python client (pip install ./client/python)" >&2
"$python" -m pip install --quiet --disable-pip-version-check ./client/python -r client/python/examples/requirements.txt

export GANGWAY_K8S_ASSETS="$assets"
echo "test.sh: control plane from $GANGWAY_K8S_ASSETS; Chromium $chromium" >&2
exec cargo test --workspace --locked --no-fail-fast "$@"
