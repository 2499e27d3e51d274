//! Spawns component processes from one long-lived thread (so `PR_SET_PDEATHSIG` only fires
//! when the whole test process dies) and stops them again: SIGTERM, deadline, SIGKILL.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a component gets to exit after SIGTERM before it is SIGKILLed.
pub const STOP_GRACE: Duration = Duration::from_secs(20);

type SpawnReply = mpsc::SyncSender<io::Result<Child>>;

/// Channel to the spawner thread. The sender lives in a static and is never dropped, so the
/// thread (the "parent" the kernel watches for PDEATHSIG) lives until the process exits.
static SPAWNER: OnceLock<Option<mpsc::Sender<(Command, SpawnReply)>>> = OnceLock::new();

fn spawner() -> Result<&'static mpsc::Sender<(Command, SpawnReply)>> {
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<(Command, SpawnReply)>();
            let thread = std::thread::Builder::new()
                .name("testenv-spawner".into())
                .spawn(move || {
                    for (mut cmd, reply) in rx {
                        // The requester may have given up; nothing to do then, and the
                        // child (if any) is reaped by nobody, which is acceptable only
                        // because that path means the caller is already failing.
                        let _ = reply.send(cmd.spawn());
                    }
                });
            match thread {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the testenv spawner thread");
                    None
                }
            }
        })
        .as_ref()
        .ok_or(Error::Spawner)
}

/// A running component: its process (leader of its own process group) and its log file.
#[derive(Debug)]
pub struct ChildProc {
    name: String,
    child: Child,
    log: PathBuf,
    exit: Option<ExitStatus>,
}

impl ChildProc {
    /// Starts `program args...` with stdout and stderr appended to `log_dir/<name>.log`.
    pub fn spawn(name: &str, program: &Path, args: &[OsString], log_dir: &Path) -> Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io(format!("duplicating {}", log.display()), e))?;

        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Own process group: a signal aimed at the test runner's group does not hit the
            // children first, and teardown can signal the whole group.
            .process_group(0);
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
        // libc functions without allocating.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died between fork and prctl; then nobody would ever
                // send the death signal, so refuse to start.
                if libc::getppid() as u32 != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }

        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        spawner()?
            .send((cmd, reply_tx))
            .map_err(|_| Error::Spawner)?;
        let child = reply_rx
            .recv()
            .map_err(|_| Error::Spawner)?
            .map_err(|e| Error::io(format!("starting {}", program.display()), e))?;
        tracing::debug!(component = name, pid = child.id(), log = %log.display(), "spawned");
        Ok(ChildProc {
            name: name.to_string(),
            child,
            log,
            exit: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status if the process has already exited (reaps it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// An `Exited` error carrying the log tail, for a component that died during start.
    pub fn exited_error(&mut self) -> Option<Error> {
        let status = self.exited()?;
        Some(Error::Exited {
            component: self.name.clone(),
            status: status.to_string(),
            tail: tail_file(&self.log, 40),
        })
    }

    /// SIGTERM to the process group, wait up to `grace`, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                tracing::debug!(component = %self.name, "stopped");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        tracing::warn!(component = %self.name, ?grace, "did not stop after SIGTERM; killing");
        self.kill();
    }

    /// SIGKILL to the process group and reap.
    pub fn kill(&mut self) {
        if self.exited().is_some() {
            return;
        }
        self.signal(libc::SIGKILL);
        self.exit = self.child.wait().ok();
    }

    fn signal(&self, sig: libc::c_int) {
        let Ok(pid) = libc::pid_t::try_from(self.child.id()) else {
            return;
        };
        // SAFETY: plain syscalls on a pid we spawned and have not reaped yet (so it cannot
        // have been recycled). Negative pid = the process group it leads.
        unsafe {
            if libc::kill(-pid, sig) != 0 {
                libc::kill(pid, sig);
            }
        }
    }
}

/// The last `lines` lines of a file (reads at most the final 256 KiB).
pub fn tail_file(path: &Path, lines: usize) -> String {
    const WINDOW: u64 = 256 * 1024;
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(WINDOW);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    if file.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Reserves `n` distinct free loopback ports. The listeners are held together so the
/// ports differ, then released for the component; a component that loses the race to
/// another process fails with "address already in use" and is restarted on new ports.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..n {
        let l = std::net::TcpListener::bind(("127.0.0.1", 0))
            .map_err(|e| Error::io("binding 127.0.0.1:0", e))?;
        listeners.push(l);
    }
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(|e| Error::io("reading a bound port", e))
        })
        .collect()
}

/// Resident set size of a process in KiB, from `/proc/<pid>/status` (`VmRSS`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("VmRSS:")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}
