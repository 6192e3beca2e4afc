//! On-disk storage of one simulator: file contents, each batch's line index and result lines, and
//! the ledger live in a private spool folder (a temporary directory, removed when the simulator is
//! dropped), so the memory a simulator holds does not grow with file sizes or line counts.
//!
//! A spool file is removed from disk when the last handle to it ([`Arc<SpoolFile>`]) is dropped:
//! deleting or expiring a file drops the store's handle, a batch still reading its input keeps the
//! bytes until it ends, and a download in flight keeps them until it is sent.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::shuffle::Order;
use crate::stats::LedgerEntry;

/// Buffer size of spool readers and of writers that fill a file in one go.
const BUFFER: usize = 64 * 1024;
/// Buffer size of result-line writers (one per sink of a running batch).
const SINK_BUFFER: usize = 64 * 1024;
/// Size of the pieces a download is streamed in.
const STREAM_CHUNK: usize = 64 * 1024;
/// Bytes per line in a line index: the line's start and length, little-endian `u64`s.
const INDEX_ENTRY: u64 = 16;

/// The spool folder of one simulator.
#[derive(Debug)]
pub(crate) struct Spool {
    dir: TempDir,
    next: AtomicU64,
}

impl Spool {
    /// A new, empty spool folder inside `parent` (created if missing), or in the system's
    /// temporary directory.
    pub(crate) fn new(parent: Option<&Path>) -> io::Result<Self> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("tranche-sim-");
        let dir = match parent {
            Some(parent) => {
                std::fs::create_dir_all(parent)?;
                builder.tempdir_in(parent)?
            }
            None => builder.tempdir()?,
        };
        Ok(Self { dir, next: AtomicU64::new(0) })
    }

    /// Where the folder is.
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A fresh spool file name (`<kind>-<n>`); nothing is on disk until it is written.
    pub(crate) fn file(&self, kind: &str) -> Arc<SpoolFile> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Arc::new(SpoolFile { path: self.dir.path().join(format!("{kind}-{n}")) })
    }
}

/// A job for the [`SpoolWorker`].
type Job = Box<dyn FnOnce() + Send>;

/// One thread of the simulator's own that runs its heavy spool work (validating and indexing a
/// batch input), one job at a time, off the async workers. One long-lived thread rather than
/// the runtime's pool of blocking threads: the allocator keeps freed memory per thread, so work
/// spread over many threads leaves memory behind in each of them.
#[derive(Debug)]
pub(crate) struct SpoolWorker {
    jobs: mpsc::Sender<Job>,
}

impl SpoolWorker {
    /// Starts the thread; it ends when the worker is dropped.
    pub(crate) fn start() -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new().name("tranche-sim-spool".to_owned()).spawn(move || {
            for job in queue {
                // A job that panics loses its answer, not the worker.
                if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
                    tracing::warn!("a simulator spool job panicked");
                }
            }
        })?;
        Ok(Self { jobs })
    }

    /// Runs `f` on the worker thread and waits for its result (None if the job was lost).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (answer, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // The asker may have gone away; then nobody needs the answer.
            answer.send(f()).ok();
        });
        self.jobs.send(job).ok()?;
        result.await.ok()
    }
}

/// One file in the spool folder, removed from disk when dropped.
#[derive(Debug)]
pub(crate) struct SpoolFile {
    path: PathBuf,
}

impl SpoolFile {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn create(&self) -> io::Result<File> {
        File::create(&self.path)
    }

    fn open(&self) -> io::Result<File> {
        File::open(&self.path)
    }

    fn append(&self) -> io::Result<File> {
        OpenOptions::new().append(true).open(&self.path)
    }
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove a spool file");
            }
        }
    }
}

/// Reads exactly `buf.len()` bytes of `file` at `offset`, without moving a shared cursor.
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(not(unix))]
    {
        let mut file = file;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
    }
}

// ---------------------------------------------------------------------------------------------
// File contents

/// The content of a stored file: a window of a spool file, or nothing for an empty file.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileBody {
    file: Option<Arc<SpoolFile>>,
    offset: u64,
    len: u64,
}

impl FileBody {
    /// All `len` bytes of `file`.
    pub(crate) fn whole(file: Arc<SpoolFile>, len: u64) -> Self {
        Self { file: Some(file), offset: 0, len }
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Where the content starts in its spool file.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The spool file holding the bytes (none for an empty body).
    pub(crate) fn spool_file(&self) -> Option<&Arc<SpoolFile>> {
        self.file.as_ref()
    }

    /// `len` bytes at `start` of the content (one positioned read of a freshly opened file).
    pub(crate) fn read_span(&self, start: u64, len: u64) -> io::Result<Vec<u8>> {
        let file = self.file.as_ref().ok_or_else(|| io::Error::other("an empty file"))?.open()?;
        let mut buf = vec![0; usize::try_from(len).map_err(io::Error::other)?];
        read_exact_at(&file, &mut buf, self.offset.saturating_add(start))?;
        Ok(buf)
    }

    /// A blocking reader of the content.
    pub(crate) fn reader(&self) -> io::Result<Box<dyn Read + Send>> {
        match &self.file {
            Some(file) if self.len > 0 => {
                let mut f = file.open()?;
                f.seek(SeekFrom::Start(self.offset))?;
                Ok(Box::new(f.take(self.len)))
            }
            _ => Ok(Box::new(io::empty())),
        }
    }

    /// The content as an async stream of pieces, read from disk as it is sent.
    pub(crate) async fn stream(&self) -> io::Result<BoxStream<'static, io::Result<Bytes>>> {
        let Some(file) = self.file.clone().filter(|_| self.len > 0) else {
            return Ok(futures::stream::empty().boxed());
        };
        let mut f = tokio::fs::File::open(file.path()).await?;
        f.seek(SeekFrom::Start(self.offset)).await?;
        let reader = f.take(self.len);
        let stream =
            tokio_util::io::ReaderStream::with_capacity(reader, STREAM_CHUNK).map(move |chunk| {
                // The handle keeps the spool file on disk until the download has been sent.
                let _keep = &file;
                chunk
            });
        Ok(stream.boxed())
    }
}

/// Writes lines to a new spool file, telling where each one starts.
#[derive(Debug)]
pub(crate) struct LineWriter {
    // The writer comes first so that it is closed before the file it writes is removed.
    out: BufWriter<File>,
    file: Arc<SpoolFile>,
    len: u64,
}

impl LineWriter {
    pub(crate) fn new(spool: &Spool, kind: &str) -> io::Result<Self> {
        let file = spool.file(kind);
        let out = BufWriter::with_capacity(BUFFER, file.create()?);
        Ok(Self { out, file, len: 0 })
    }

    /// Appends `line` and a newline; returns where the line starts.
    pub(crate) fn push(&mut self, line: &[u8]) -> io::Result<u64> {
        let start = self.len;
        self.out.write_all(line)?;
        self.out.write_all(b"\n")?;
        self.len += u64::try_from(line.len()).unwrap_or(u64::MAX) + 1;
        Ok(start)
    }

    /// The written file.
    pub(crate) fn finish(self) -> io::Result<FileBody> {
        let Self { mut out, file, len } = self;
        out.flush()?;
        drop(out);
        Ok(FileBody::whole(file, len))
    }
}

// ---------------------------------------------------------------------------------------------
// Batch lines

/// Records where each runnable line of a batch is (in an index file) and hashes their custom_ids
/// into the key of the batch's run order.
#[derive(Debug)]
pub(crate) struct IndexWriter {
    // The writer comes first so that it is closed before the file it writes is removed.
    out: BufWriter<File>,
    file: Arc<SpoolFile>,
    count: u64,
    ids: Sha256,
}

impl IndexWriter {
    pub(crate) fn new(spool: &Spool, seed: u64) -> io::Result<Self> {
        let file = spool.file("index");
        let out = BufWriter::with_capacity(BUFFER, file.create()?);
        let mut ids = Sha256::new();
        ids.update(seed.to_le_bytes());
        Ok(Self { out, file, count: 0, ids })
    }

    /// Adds the next line: `len` bytes at `start` of the data file.
    pub(crate) fn push(&mut self, start: u64, len: u64, custom_id: &str) -> io::Result<()> {
        self.out.write_all(&start.to_le_bytes())?;
        self.out.write_all(&len.to_le_bytes())?;
        self.ids.update(custom_id.as_bytes());
        self.ids.update([0]);
        self.count += 1;
        Ok(())
    }

    /// The lines, their bytes in `data`.
    pub(crate) fn finish(self, data: FileBody) -> io::Result<SpooledLines> {
        let Self { mut out, file, count, ids } = self;
        out.flush()?;
        drop(out);
        let order = Order::new(count, ids.finalize().into());
        Ok(SpooledLines { data, index: file, count, order })
    }
}

/// The runnable lines of a batch, on disk: the data file, the index of where each line is, and
/// the order they run in.
#[derive(Debug)]
pub(crate) struct SpooledLines {
    data: FileBody,
    index: Arc<SpoolFile>,
    count: u64,
    order: Order,
}

impl SpooledLines {
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn order(&self) -> &Order {
        &self.order
    }

    /// Opens the files for reading lines.
    pub(crate) fn reader(&self) -> io::Result<LineReader> {
        let data = self
            .data
            .spool_file()
            .ok_or_else(|| io::Error::other("the batch has lines but no data file"))?
            .open()?;
        Ok(LineReader { index: self.index.open()?, data })
    }
}

/// Reads single lines of a batch by their input index (two positioned reads each).
#[derive(Debug)]
pub(crate) struct LineReader {
    index: File,
    data: File,
}

impl LineReader {
    /// Line `i` (0-based among the runnable lines) into `buf`, without its newline.
    pub(crate) fn read(&self, i: u64, buf: &mut Vec<u8>) -> io::Result<()> {
        let mut entry = [0u8; 16];
        read_exact_at(&self.index, &mut entry, i.saturating_mul(INDEX_ENTRY))?;
        let (start, len) = entry.split_at(8);
        let mut word = [0u8; 8];
        word.copy_from_slice(start);
        let start = u64::from_le_bytes(word);
        word.copy_from_slice(len);
        let len = usize::try_from(u64::from_le_bytes(word))
            .map_err(|_| io::Error::other("a line longer than memory"))?;
        buf.clear();
        buf.resize(len, 0);
        read_exact_at(&self.data, buf, start)
    }
}

// ---------------------------------------------------------------------------------------------
// Result lines

/// The rendered result lines of one batch bound for one file, appended to a spool file as lines
/// run.
///
/// Lines are written in the order they ran, which is shuffled, but a file holding a subset of the
/// lines (say, the errors) could still list them in input order by chance. So the first line is
/// held back in memory and a hole its size is left at the start of the file: at the end it fills
/// the hole, or, if the lines are in input order, goes after the last one and the file starts
/// past the hole. Memory: one line and a write buffer while lines run.
#[derive(Debug, Default)]
pub(crate) struct ResultSink {
    // The writer comes first so that it is closed before the file it writes is removed.
    writer: Option<BufWriter<File>>,
    file: Option<Arc<SpoolFile>>,
    lines: u64,
    /// The first line, with its newline.
    first: Vec<u8>,
    /// Input index of the last line written.
    last_idx: u64,
    /// Whether every line so far came after the one before it in input order.
    ascending: bool,
}

impl ResultSink {
    /// Lines written so far.
    pub(crate) fn lines(&self) -> u64 {
        self.lines
    }

    /// Appends the result line of input line `idx` (`line` has no newline).
    pub(crate) fn push(&mut self, spool: &Spool, idx: u64, line: &[u8]) -> io::Result<()> {
        if self.lines == 0 {
            let file = spool.file("result");
            let mut first = Vec::with_capacity(line.len() + 1);
            first.extend_from_slice(line);
            first.push(b'\n');
            file.create()?.set_len(u64::try_from(first.len()).unwrap_or(u64::MAX))?;
            self.file = Some(file);
            self.first = first;
            self.ascending = true;
        } else {
            let writer = match &mut self.writer {
                Some(writer) => writer,
                None => {
                    let file = self
                        .file
                        .as_ref()
                        .ok_or_else(|| io::Error::other("a result sink without a file"))?;
                    self.writer.insert(BufWriter::with_capacity(SINK_BUFFER, file.append()?))
                }
            };
            writer.write_all(line)?;
            writer.write_all(b"\n")?;
            self.ascending &= idx > self.last_idx;
        }
        self.last_idx = idx;
        self.lines += 1;
        Ok(())
    }

    /// Flushes and closes the writer (the sink keeps its state; writing reopens the file).
    pub(crate) fn close(&mut self) -> io::Result<()> {
        match self.writer.take() {
            Some(mut writer) => writer.flush(),
            None => Ok(()),
        }
    }

    /// The finished file (empty when no line was written); the sink is reset.
    pub(crate) fn finish(&mut self) -> io::Result<FileBody> {
        self.close()?;
        let lines = std::mem::take(&mut self.lines);
        let first = std::mem::take(&mut self.first);
        let Some(file) = self.file.take() else {
            return Ok(FileBody::default());
        };
        let head = u64::try_from(first.len()).unwrap_or(u64::MAX);
        let mut f = OpenOptions::new().write(true).open(file.path())?;
        let written = f.metadata()?.len();
        if lines >= 2 && self.ascending {
            f.seek(SeekFrom::End(0))?;
            f.write_all(&first)?;
            Ok(FileBody { file: Some(file), offset: head, len: written })
        } else {
            f.seek(SeekFrom::Start(0))?;
            f.write_all(&first)?;
            Ok(FileBody { file: Some(file), offset: 0, len: written })
        }
    }

    /// Bytes this sink holds in memory.
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.first.capacity() + self.writer.as_ref().map_or(0, BufWriter::capacity)
    }
}

// ---------------------------------------------------------------------------------------------
// The ledger

/// The ledger as JSONL on disk, one entry a line, exactly as `GET /sim/ledger` serves it.
#[derive(Debug)]
pub(crate) struct LedgerLog {
    // The writer comes first so that it is closed before the file it writes is removed.
    out: BufWriter<File>,
    file: Arc<SpoolFile>,
    len: u64,
}

impl LedgerLog {
    pub(crate) fn new(spool: &Spool) -> io::Result<Self> {
        let file = spool.file("ledger");
        let out = BufWriter::with_capacity(SINK_BUFFER, file.create()?);
        Ok(Self { out, file, len: 0 })
    }

    pub(crate) fn append(&mut self, entry: &LedgerEntry) -> io::Result<()> {
        let mut line = serde_json::to_vec(entry)?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        self.len += u64::try_from(line.len()).unwrap_or(u64::MAX);
        Ok(())
    }

    /// The ledger so far.
    pub(crate) fn snapshot(&mut self) -> io::Result<FileBody> {
        self.out.flush()?;
        Ok(FileBody { file: Some(self.file.clone()), offset: 0, len: self.len })
    }

    /// Calls `f` with every entry so far, oldest first.
    pub(crate) fn for_each(&mut self, mut f: impl FnMut(LedgerEntry)) -> io::Result<()> {
        let reader = BufReader::with_capacity(BUFFER, self.snapshot()?.reader()?);
        for line in reader.split(b'\n') {
            let line = line?;
            if !line.is_empty() {
                f(serde_json::from_slice(&line)?);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &FileBody) -> Vec<u8> {
        let mut out = Vec::new();
        body.reader().unwrap().read_to_end(&mut out).unwrap();
        out
    }

    fn sink_file(spool: &Spool, lines: &[(u64, &str)]) -> Vec<u8> {
        let mut sink = ResultSink::default();
        for (i, (idx, line)) in lines.iter().enumerate() {
            sink.push(spool, *idx, line.as_bytes()).unwrap();
            if i % 2 == 0 {
                // Steps close the writer between runs; the file must survive that.
                sink.close().unwrap();
            }
        }
        let body = sink.finish().unwrap();
        assert_eq!(sink.held_bytes(), 0);
        let bytes = read(&body);
        assert_eq!(u64::try_from(bytes.len()).unwrap(), body.len());
        bytes
    }

    #[test]
    fn result_files_are_never_in_input_order() {
        let spool = Spool::new(None).unwrap();
        assert_eq!(sink_file(&spool, &[(1, "b"), (4, "e")]), b"e\nb\n");
        assert_eq!(sink_file(&spool, &[(4, "e"), (1, "b")]), b"e\nb\n");
        assert_eq!(sink_file(&spool, &[(0, "a")]), b"a\n");
        assert_eq!(sink_file(&spool, &[]), b"");
        assert_eq!(sink_file(&spool, &[(0, "a"), (2, "cc"), (5, "f")]), b"cc\nf\na\n");
        assert_eq!(sink_file(&spool, &[(5, "f"), (0, "a"), (2, "cc")]), b"f\na\ncc\n");
    }

    #[test]
    fn spool_files_leave_the_disk_with_their_last_handle() {
        let spool = Spool::new(None).unwrap();
        let mut w = LineWriter::new(&spool, "data").unwrap();
        assert_eq!(w.push(b"one").unwrap(), 0);
        assert_eq!(w.push(b"two").unwrap(), 4);
        let body = w.finish().unwrap();
        assert_eq!(read(&body), b"one\ntwo\n");
        let path = body.spool_file().unwrap().path().to_path_buf();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8);
        let copy = body.clone();
        drop(body);
        assert!(path.exists());
        drop(copy);
        assert!(!path.exists());
        let dir = spool.path().to_path_buf();
        assert!(dir.exists());
        drop(spool);
        assert!(!dir.exists());
    }

    #[test]
    fn lines_are_read_back_by_index() {
        let spool = Spool::new(None).unwrap();
        let mut data = LineWriter::new(&spool, "data").unwrap();
        let mut index = IndexWriter::new(&spool, 7).unwrap();
        for (i, text) in ["alpha", "", "gamma-gamma"].iter().enumerate() {
            let start = data.push(text.as_bytes()).unwrap();
            index.push(start, text.len() as u64, &format!("c{i}")).unwrap();
        }
        let lines = index.finish(data.finish().unwrap()).unwrap();
        assert_eq!(lines.count(), 3);
        assert_eq!(lines.order().len(), 3);
        let reader = lines.reader().unwrap();
        let mut buf = Vec::new();
        reader.read(2, &mut buf).unwrap();
        assert_eq!(buf, b"gamma-gamma");
        reader.read(1, &mut buf).unwrap();
        assert_eq!(buf, b"");
        reader.read(0, &mut buf).unwrap();
        assert_eq!(buf, b"alpha");
        assert!(reader.read(3, &mut buf).is_err());
    }
}
