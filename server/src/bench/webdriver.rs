//! A small W3C WebDriver client for driving a real headless Chromium through
//! ChromeDriver: start a session, open a page, run a script, take a screenshot.
//! Used by `gangway bench ui` and the web view's browser test; it speaks plain
//! HTTP/1.1 to the driver on loopback (one request per connection), so it needs no
//! HTTP client crate. The driver process is owned and killed on drop.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// Time ChromeDriver may take to start answering, in ms.
pub const DRIVER_START_MS: u64 = 20_000;
/// Time one WebDriver command may take (a page load included), in ms.
pub const COMMAND_TIMEOUT_MS: u64 = 60_000;
/// Largest answer read from the driver (a full-page screenshot fits), in bytes.
pub const ANSWER_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Where the browser and its driver are.
#[derive(Debug, Clone)]
pub struct BrowserPaths {
    /// The ChromeDriver binary.
    pub chromedriver: PathBuf,
    /// The Chromium binary.
    pub chromium: PathBuf,
}

impl Default for BrowserPaths {
    /// Debian's packages (`chromium`, `chromium-driver`), or `GANGWAY_CHROMEDRIVER`
    /// and `GANGWAY_CHROMIUM` when set.
    fn default() -> Self {
        let from_env = |var: &str, default: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(default))
        };
        Self {
            chromedriver: from_env("GANGWAY_CHROMEDRIVER", "/usr/bin/chromedriver"),
            chromium: from_env("GANGWAY_CHROMIUM", "/usr/bin/chromium"),
        }
    }
}

/// A WebDriver step that failed.
#[derive(Debug, thiserror::Error)]
pub enum WebDriverError {
    /// The driver could not be started.
    #[error("cannot start {path}: {reason}")]
    Start {
        /// The driver binary.
        path: String,
        /// Why.
        reason: String,
    },
    /// A request to the driver failed on the wire.
    #[error("WebDriver {command}: {reason}")]
    Transport {
        /// The command.
        command: String,
        /// Why.
        reason: String,
    },
    /// The driver answered with an error.
    #[error("WebDriver {command}: {error}: {message}")]
    Command {
        /// The command.
        command: String,
        /// The WebDriver error code.
        error: String,
        /// Its message.
        message: String,
    },
    /// A condition did not hold in time.
    #[error("{what} did not happen within {waited_ms} ms")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited_ms: u64,
    },
}

/// A headless Chromium session driven through ChromeDriver.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile_dir::Dir,
}

mod tempfile_dir {
    //! A profile directory removed on drop (the browser must not share one).
    use std::path::{Path, PathBuf};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new() -> std::io::Result<Self> {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = std::env::temp_dir()
                .join(format!("gangway-browser-{}-{nanos}", std::process::id()));
            std::fs::create_dir_all(&path)?;
            Ok(Self(path))
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn free_port() -> Result<u16, WebDriverError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| WebDriverError::Start {
            path: "a loopback port".into(),
            reason: e.to_string(),
        })
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium session with a window of
    /// `width`×`height` pixels.
    pub async fn start(
        paths: &BrowserPaths,
        width: u32,
        height: u32,
    ) -> Result<Browser, WebDriverError> {
        let start_error = |reason: String| WebDriverError::Start {
            path: paths.chromedriver.display().to_string(),
            reason,
        };
        if !paths.chromium.exists() {
            return Err(WebDriverError::Start {
                path: paths.chromium.display().to_string(),
                reason:
                    "not found (apt-get install chromium chromium-driver, or set GANGWAY_CHROMIUM)"
                        .into(),
            });
        }
        let port = free_port()?;
        let driver = Command::new(&paths.chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| start_error(e.to_string()))?;
        let profile = tempfile_dir::Dir::new().map_err(|e| start_error(e.to_string()))?;
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            _profile: profile,
        };
        let started = Instant::now();
        loop {
            match browser.call("GET", "/status", None, "status").await {
                Ok(v) if v["ready"].as_bool() == Some(true) => break,
                _ if started.elapsed() > Duration::from_millis(DRIVER_START_MS) => {
                    return Err(start_error(format!(
                        "not ready within {DRIVER_START_MS} ms"
                    )))
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let args = json!([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", browser._profile.path().display()),
        ]);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": paths.chromium.display().to_string(), "args": args},
        }}});
        let session = browser
            .call("POST", "/session", Some(caps), "new session")
            .await?;
        browser.session = session["sessionId"]
            .as_str()
            .ok_or_else(|| start_error(format!("no session id in {session}")))?
            .to_string();
        Ok(browser)
    }

    /// Opens `url` and waits for its load event.
    pub async fn goto(&self, url: &str) -> Result<(), WebDriverError> {
        self.session_call("POST", "url", Some(json!({ "url": url })), "navigate")
            .await
            .map(|_| ())
    }

    /// Runs `script` (a function body; `arguments` holds `args`) and returns its value.
    pub async fn eval(&self, script: &str, args: Value) -> Result<Value, WebDriverError> {
        self.session_call(
            "POST",
            "execute/sync",
            Some(json!({ "script": script, "args": args })),
            "execute script",
        )
        .await
    }

    /// Polls `script` every 20 ms until it returns something other than null or
    /// false, and returns that.
    pub async fn wait_for(
        &self,
        what: &str,
        script: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<Value, WebDriverError> {
        let started = Instant::now();
        loop {
            let v = self.eval(script, args.clone()).await?;
            if !(v.is_null() || v == Value::Bool(false)) {
                return Ok(v);
            }
            if started.elapsed() > timeout {
                return Err(WebDriverError::Timeout {
                    what: what.to_string(),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Saves a PNG of the window to `path`.
    pub async fn screenshot(&self, path: &Path) -> Result<(), WebDriverError> {
        use base64::Engine as _;
        let v = self
            .session_call("GET", "screenshot", None, "screenshot")
            .await?;
        let png = v
            .as_str()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .ok_or_else(|| WebDriverError::Transport {
                command: "screenshot".into(),
                reason: "the answer is not base64".into(),
            })?;
        std::fs::write(path, png).map_err(|e| WebDriverError::Transport {
            command: "screenshot".into(),
            reason: format!("write {}: {e}", path.display()),
        })
    }

    /// Ends the session and stops the driver.
    pub async fn quit(mut self) {
        let path = format!("/session/{}", self.session);
        let _ = self.call("DELETE", &path, None, "end session").await;
        let _ = self.driver.kill().await;
    }

    async fn session_call(
        &self,
        method: &str,
        what: &str,
        body: Option<Value>,
        command: &str,
    ) -> Result<Value, WebDriverError> {
        let path = format!("/session/{}/{what}", self.session);
        self.call(method, &path, body, command).await
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        command: &str,
    ) -> Result<Value, WebDriverError> {
        let transport = |reason: String| WebDriverError::Transport {
            command: command.to_string(),
            reason,
        };
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .map_err(|e| transport(format!("connect: {e}")))?;
            let request = format!(
                "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                self.port,
                body.len()
            );
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|e| transport(format!("send: {e}")))?;
            read_answer(&mut stream)
                .await
                .map_err(|e| transport(format!("read: {e}")))
        };
        let body = tokio::time::timeout(Duration::from_millis(COMMAND_TIMEOUT_MS), exchange)
            .await
            .map_err(|_| transport(format!("no answer within {COMMAND_TIMEOUT_MS} ms")))??;
        let answer: Value = serde_json::from_slice(&body)
            .map_err(|e| transport(format!("the answer is not JSON: {e}")))?;
        let value = answer.get("value").cloned().unwrap_or(Value::Null);
        if let Some(error) = value.get("error").and_then(Value::as_str) {
            return Err(WebDriverError::Command {
                command: command.to_string(),
                error: error.to_string(),
                message: value["message"].as_str().unwrap_or("").to_string(),
            });
        }
        Ok(value)
    }
}

/// Reads one HTTP/1.1 answer's body: up to the end of the headers, then
/// `Content-Length` bytes (the driver keeps the connection open after it).
async fn read_answer(stream: &mut tokio::net::TcpStream) -> Result<Vec<u8>, String> {
    let mut raw = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            if head.contains("transfer-encoding: chunked") {
                return Err("a chunked answer (this client reads Content-Length only)".into());
            }
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            let body_start = end + 4;
            match length {
                Some(n) if n > ANSWER_BYTES_MAX => return Err(format!("an answer of {n} bytes")),
                Some(n) if raw.len() >= body_start + n => {
                    return Ok(raw[body_start..body_start + n].to_vec())
                }
                _ => {}
            }
        }
        if raw.len() > ANSWER_BYTES_MAX {
            return Err(format!("an answer over {ANSWER_BYTES_MAX} bytes"));
        }
        let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return match raw.windows(4).position(|w| w == b"\r\n\r\n") {
                Some(end) => Ok(raw[end + 4..].to_vec()),
                None => Err("the connection closed before the headers ended".into()),
            };
        }
        raw.extend_from_slice(&chunk[..n]);
    }
}
