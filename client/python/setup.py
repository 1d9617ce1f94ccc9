"""Builds gangway-client: generates the gRPC stubs from gangway's proto files into
gangway_client/_proto before the package is collected.

The proto folder is ../../proto/proto beside this file (the repository's), or the one
GANGWAY_PROTO_DIR names.
"""

import os
import re
import tempfile
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
# The services a framework uses: the scheduler, and the inventory (nodes) it may read.
PROTOS = ["gangway/v1/scheduler.proto", "gangway/v1/inventory.proto"]


def proto_root() -> Path:
    root = Path(os.environ.get("GANGWAY_PROTO_DIR", HERE.parent.parent / "proto" / "proto"))
    missing = [p for p in PROTOS if not (root / p).is_file()]
    if missing:
        raise SystemExit(
            f"gangway-client: {root} lacks {', '.join(missing)}; build from the gangway "
            "repository, or set GANGWAY_PROTO_DIR to its proto/proto folder"
        )
    return root


def generate(out: Path) -> None:
    """Runs protoc (from grpcio-tools) and puts the modules flat in `out`, importing
    each other relatively."""
    from grpc_tools import protoc

    root = proto_root()
    include = Path(protoc.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{root}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *PROTOS,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("gangway-client: protoc failed on " + ", ".join(PROTOS))
        out.mkdir(parents=True, exist_ok=True)
        for f in (Path(tmp) / "gangway" / "v1").iterdir():
            text = re.sub(r"^from gangway\.v1 import ", "from . import ", f.read_text(), flags=re.M)
            (out / f.name).write_text(text)
    (out / "__init__.py").write_text('"""Generated from gangway\'s proto files at build time."""\n')


# Before setup(): setuptools lists the packages (gangway_client._proto among them)
# before any build command runs.
generate(HERE / "gangway_client" / "_proto")
setup()
