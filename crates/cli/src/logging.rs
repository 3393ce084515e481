//! Where every ferry program's logs go: stderr, written by a thread of their own.
//!
//! A node proxy writes an access-log line for every connection it carries, and wrote it from
//! the runtime worker that closed the connection, one unbuffered `write(2)` to stderr per line
//! (with, in the lab, an inotify event for each: its control plane watches the directory that
//! holds the logs). A line is now formatted on the worker, as before, and handed to a writer
//! thread (`tracing-appender`'s non-blocking writer) over a bounded queue. The thread writes
//! what it finds queued in one batch, then pauses for [`WRITE_PAUSE`] before it looks again:
//! lines that come in the meantime wait in the queue without waking it, so a busy proxy pays
//! for a wake-up and a `write(2)` per batch, not per line, and a line still reaches stderr
//! within about [`WRITE_PAUSE`]. Nothing that logs waits on stderr: when the queue is full
//! (stderr taking lines more slowly than they come) a new line is dropped and counted, and the
//! count is reported when the program ends. [`Logs`], held by `main` for the life of the
//! program, writes out every queued line when it is dropped (a clean exit, or after a SIGTERM
//! drain), waiting up to a second for the thread.

use std::io::{BufWriter, Write};
use std::time::Duration;

use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::util::SubscriberInitExt as _;

/// Lines that may wait for the writer thread before new ones are dropped: about two seconds of
/// a node proxy's access log at 2,000 new connections/s, and hundreds of times what comes in
/// one [`WRITE_PAUSE`]. The queue's slots are allocated when it is made (32 bytes each, 128 KiB;
/// `tracing-appender`'s default of 128,000 lines would hold 4 MB in every ferry process).
const QUEUED_LINES: usize = 4096;

/// The most the writer thread gathers before a `write(2)`; it writes sooner whenever it finds
/// the queue empty.
const BATCH_BYTES: usize = 64 * 1024;

/// How long the writer thread leaves the queue alone after writing a batch. Each line sent to
/// a thread asleep on an empty queue wakes it (a futex wake, two context switches): woken per
/// line, the proxies spent more CPU per new connection than with a direct `write(2)` per line
/// (`ferry lab bench`, medians of 17 alternating runs: 420 against 390 us); paused, the thread
/// finds the last 10 ms of lines queued and writes them at once (340 us, docs/hbone.md).
const WRITE_PAUSE: Duration = Duration::from_millis(10);

/// The logging of a running program. Dropping it writes out the lines still queued, then
/// reports on stderr how many were dropped, if any.
#[must_use = "dropping the logs stops the writer thread: later lines are lost"]
pub(crate) struct Logs {
    /// Taken in `drop`: the thread is stopped before the count is read.
    flush: Option<WorkerGuard>,
    dropped: ErrorCounter,
    /// The queue's bound, for the report.
    queued: usize,
}

// === impl Logs ===

impl Drop for Logs {
    fn drop(&mut self) {
        drop(self.flush.take());
        if let Some(note) = dropped_note(self.dropped.dropped_lines(), self.queued) {
            // The thread has stopped: this is the last thing written, and a failure to write
            // it has nowhere else to go.
            let _ = writeln!(std::io::stderr(), "{note}");
        }
    }
}

/// Structured logs on stderr for the life of the returned [`Logs`]: `RUST_LOG` sets levels,
/// `FERRY_LOG_FORMAT=json` writes JSON lines.
pub(crate) fn init() -> Logs {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let json = std::env::var("FERRY_LOG_FORMAT").is_ok_and(|f| f == "json");
    let (writer, logs) = writer(std::io::stderr(), QUEUED_LINES, WRITE_PAUSE);
    subscriber(writer, filter, Format { json, ansi }).init();
    logs
}

/// How lines are written.
#[derive(Clone, Copy, Debug)]
struct Format {
    json: bool,
    ansi: bool,
}

/// The subscriber that formats events as `format` says into `writer`.
fn subscriber(
    writer: NonBlocking,
    filter: tracing_subscriber::EnvFilter,
    format: Format,
) -> Box<dyn tracing::Subscriber + Send + Sync> {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(format.ansi)
        .with_writer(writer);
    if format.json {
        Box::new(builder.json().finish())
    } else {
        Box::new(builder.finish())
    }
}

/// A writer that queues each line for a thread writing into `out` in batches, dropping lines
/// beyond `queued` waiting ones; and the [`Logs`] that stop the thread.
fn writer(out: impl Write + Send + 'static, queued: usize, pause: Duration) -> (NonBlocking, Logs) {
    let (writer, flush) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(queued)
        .thread_name("ferry-log")
        .finish(Paced {
            out: BufWriter::with_capacity(BATCH_BYTES, out),
            pause,
            uncached: false,
        });
    let dropped = writer.error_counter();
    (
        writer,
        Logs {
            flush: Some(flush),
            dropped,
            queued,
        },
    )
}

/// The writer thread's output: lines gathered into batches, and a pause after each batch is
/// written. The thread flushes its writer each time it has emptied the queue.
struct Paced<W: Write> {
    out: BufWriter<W>,
    pause: Duration,
    /// The writer thread's jemalloc cache is off ([`without_thread_cache`]): set at its first
    /// line.
    uncached: bool,
}

// === impl Paced ===

impl<W: Write> Write for Paced<W> {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        if !self.uncached {
            self.uncached = true;
            without_thread_cache();
        }
        self.out.write(line)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        std::thread::sleep(self.pause);
        Ok(())
    }
}

/// Switches the calling thread's jemalloc cache off. The writer thread frees every line the
/// workers formatted: with a cache it kept up to its cache's bound of freed lines after a
/// burst of connections (measured by flushing it through gdb 60 s after 5,000 closed: up to
/// 68 KiB a node proxy), which no trim reaches. Without one each free goes straight back to
/// the line's arena, one free per connection.
#[allow(unsafe_code)]
fn without_thread_cache() -> bool {
    let mut off = false;
    // SAFETY: a NUL-terminated name and a value of the option's type (`bool`) and size; no
    // old value is read; it acts on the calling thread's own cache only.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"thread.tcache.enabled".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut off).cast(),
            std::mem::size_of::<bool>(),
        ) == 0
    }
}

/// What is said at the end about `dropped` lines, with a queue of `queued`.
fn dropped_note(dropped: usize, queued: usize) -> Option<String> {
    (dropped > 0).then(|| {
        format!(
            "ferry: {dropped} log lines were dropped: stderr took lines more slowly than they came (more than {queued} waited)"
        )
    })
}

#[cfg(test)]
mod tests {
    use std::io::{self, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use parking_lot::{Condvar, Mutex};
    use tracing_subscriber::EnvFilter;

    use super::{Format, Logs};

    const TEXT: Format = Format {
        json: false,
        ansi: false,
    };

    /// Where the writer thread writes: what it wrote, behind a gate the test opens (a stalled
    /// stderr while it is closed).
    #[derive(Clone, Default)]
    struct Sink {
        written: Arc<Mutex<Vec<u8>>>,
        open: Arc<(Mutex<bool>, Condvar)>,
        /// A write is held at the closed gate.
        held: Arc<AtomicBool>,
        /// Whether the writing thread's jemalloc cache was on, at the last write.
        cached: Arc<Mutex<Option<bool>>>,
    }

    impl Sink {
        fn opened() -> Self {
            let sink = Self::default();
            sink.open();
            sink
        }

        fn open(&self) {
            let (open, changed) = &*self.open;
            *open.lock() = true;
            changed.notify_all();
        }

        /// The messages of the lines written so far.
        fn messages(&self) -> Vec<String> {
            let written = self.written.lock();
            String::from_utf8_lossy(&written)
                .lines()
                .map(|l| l.rsplit(": ").next().unwrap_or_default().to_string())
                .collect()
        }

        /// Polls until the writer thread waits at the closed gate.
        fn wait_until_held(&self) {
            poll("the writer thread to reach the closed gate", || {
                self.held.load(Ordering::SeqCst)
            });
        }
    }

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (open, changed) = &*self.open;
            let mut is_open = open.lock();
            while !*is_open {
                self.held.store(true, Ordering::SeqCst);
                changed.wait(&mut is_open);
            }
            *self.cached.lock() = Some(thread_cache_enabled());
            self.written.lock().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// `thread.tcache.enabled` of the calling thread.
    fn thread_cache_enabled() -> bool {
        crate::tests::option(c"thread.tcache.enabled", false)
    }

    fn poll(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Logs through the non-blocking writer into `sink`, with `queued` lines of queue, while
    /// `f` runs on this thread.
    fn logging(sink: &Sink, queued: usize, f: impl FnOnce()) -> Logs {
        let (writer, logs) = super::writer(sink.clone(), queued, super::WRITE_PAUSE);
        let subscriber = super::subscriber(writer, EnvFilter::new("info"), TEXT);
        tracing::subscriber::with_default(subscriber, f);
        logs
    }

    fn messages(range: std::ops::Range<usize>) -> Vec<String> {
        range.map(|i| format!("line {i}")).collect()
    }

    /// The writer thread frees every line without a cache of its own (one no trim reaches),
    /// where other threads keep theirs.
    #[test]
    fn the_writer_thread_runs_without_a_thread_cache() {
        assert!(thread_cache_enabled(), "a thread has a cache by default");
        let sink = Sink::opened();
        let logs = logging(&sink, 64, || {
            tracing::info!(target: "access", "line 0");
        });
        poll("the line to be written", || sink.cached.lock().is_some());
        drop(logs);
        assert_eq!(
            *sink.cached.lock(),
            Some(false),
            "the writer's cache is off"
        );
        assert!(thread_cache_enabled(), "this thread's cache is still on");
    }

    /// A line is written out while the program runs, without waiting for more lines or for
    /// the end: tests and operators reading a log see it at once.
    #[test]
    fn a_line_reaches_stderr_while_the_program_runs() {
        let sink = Sink::opened();
        let logs = logging(&sink, 64, || {
            tracing::info!(target: "access", "line 0");
        });
        poll("the line to be written", || {
            sink.messages() == messages(0..1)
        });
        drop(logs);
        assert_eq!(sink.messages(), messages(0..1));
    }

    /// Lines queued behind a stalled stderr are all written, in order, by the time the logs
    /// are dropped (the end of `main`, after a SIGTERM drain too).
    #[test]
    fn queued_lines_are_all_written_when_the_logs_are_dropped() {
        let sink = Sink::default();
        let logs = logging(&sink, 64, || {
            tracing::info!("line 0");
            sink.wait_until_held();
            for i in 1..50 {
                tracing::info!("line {i}");
            }
        });
        assert!(sink.messages().is_empty(), "{:?}", sink.messages());
        sink.open();
        drop(logs);
        // The guard's drop waits a bounded time for the writer thread: on a loaded machine
        // it may return before the last lines are out.
        poll("50 lines written", || sink.messages().len() >= 50);
        assert_eq!(sink.messages(), messages(0..50));
    }

    /// With stderr stalled and the queue full, logging goes on without waiting: each line that
    /// does not fit is dropped and counted, and the rest are written once stderr takes them.
    #[test]
    fn a_full_queue_drops_and_counts_lines_instead_of_waiting() {
        let sink = Sink::default();
        let (writer, logs) = super::writer(sink.clone(), 16, super::WRITE_PAUSE);
        let subscriber = super::subscriber(writer, EnvFilter::new("info"), TEXT);
        let logged = Arc::new(AtomicBool::new(false));
        // On a thread of its own: a line that waited for room would hold it at the stalled
        // stderr, and the poll below would fail.
        let logger = std::thread::spawn({
            let (sink, logged) = (sink.clone(), logged.clone());
            move || {
                tracing::subscriber::with_default(subscriber, || {
                    tracing::info!("line 0");
                    sink.wait_until_held();
                    for i in 1..101 {
                        tracing::info!("line {i}");
                    }
                });
                logged.store(true, Ordering::SeqCst);
            }
        });
        poll("100 lines logged while stderr is stalled", || {
            logged.load(Ordering::SeqCst)
        });
        logger.join().unwrap();
        assert_eq!(logs.dropped.dropped_lines(), 100 - 16);
        sink.open();
        drop(logs);
        poll("17 lines written", || sink.messages().len() >= 17);
        assert_eq!(sink.messages(), messages(0..17));
        let note = super::dropped_note(84, 16).unwrap_or_default();
        assert!(note.contains("84 log lines were dropped"), "{note}");
        assert_eq!(super::dropped_note(0, 16), None);
    }
}
