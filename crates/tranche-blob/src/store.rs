//! The blob store over `object_store`: `file:///path` (a local folder) or `s3://bucket/prefix`
//! (S3-compatible; endpoint, credentials and region from the standard `AWS_*` variables, plain
//! HTTP only with `AWS_ALLOW_HTTP=true`).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::{BlobError, BlobKey, BlobWriter};

/// How much of a local object one read takes: a few steps of an engine each stream an object
/// at once, so each holds little; 256 KiB is still one system call per 250 or so lines.
const LOCAL_READ_BYTES: usize = 256 << 10;

/// An object as written: its key, size and SHA-256. Known only once the object is whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobRef {
    pub key: BlobKey,
    pub size: u64,
    /// Lower-case hex.
    pub sha256: String,
}

/// A blob store. Cheap to clone.
#[derive(Clone)]
pub struct BlobStore {
    pub(crate) inner: Arc<dyn ObjectStore>,
    url: String,
    /// A local store's file system and the prefix of its objects, to find an object's file
    /// (read from one open file; staging files a killed writer left beside it).
    local: Option<Local>,
}

/// A local store's files, named as `object_store` names them (every part of the path
/// percent-encoded where it must be, the folder's own included).
#[derive(Clone)]
struct Local {
    fs: Arc<LocalFileSystem>,
    prefix: object_store::path::Path,
}

impl Local {
    /// The file an object rests in.
    fn file(&self, key: &BlobKey) -> Result<PathBuf, BlobError> {
        let location: object_store::path::Path =
            self.prefix.parts().chain(key.path().parts()).collect();
        self.fs.path_to_filesystem(&location).map_err(BlobError::backend("locating", key.as_str()))
    }
}

impl std::fmt::Debug for BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobStore").field("url", &self.url).finish_non_exhaustive()
    }
}

fn bad_url(url: &str, reason: impl std::fmt::Display) -> BlobError {
    BlobError::Url { url: url.to_owned(), reason: reason.to_string() }
}

impl BlobStore {
    /// Opens the store at `url`; S3 settings come from the `AWS_*` environment variables.
    pub fn open(url: &str) -> Result<Self, BlobError> {
        Self::open_with(url, AmazonS3Builder::from_env())
    }

    /// Opens the store at `url` with S3 settings given as `AWS_*` keys and values (for a store
    /// whose settings are not in the environment).
    pub fn open_with_options<'a>(
        url: &str,
        options: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, BlobError> {
        let mut builder = AmazonS3Builder::new();
        for (key, value) in options {
            let key: AmazonS3ConfigKey =
                key.to_ascii_lowercase().parse().map_err(|e| bad_url(url, e))?;
            builder = builder.with_config(key, value);
        }
        Self::open_with(url, builder)
    }

    fn open_with(url: &str, s3: AmazonS3Builder) -> Result<Self, BlobError> {
        let parsed = url::Url::parse(url).map_err(|e| bad_url(url, e))?;
        let inner: Arc<dyn ObjectStore> = match parsed.scheme() {
            "file" => {
                let root = parsed.to_file_path().map_err(|()| bad_url(url, "not a local path"))?;
                return Ok(Self::local(&root));
            }
            "s3" => {
                let bucket = parsed.host_str().filter(|b| !b.is_empty());
                let bucket = bucket.ok_or_else(|| bad_url(url, "no bucket"))?;
                let store = s3.with_bucket_name(bucket).build().map_err(|e| bad_url(url, e))?;
                let prefix = parsed.path().trim_matches('/');
                if prefix.is_empty() {
                    Arc::new(store)
                } else {
                    Arc::new(PrefixStore::new(store, prefix))
                }
            }
            other => {
                return Err(bad_url(
                    url,
                    format!("unknown scheme `{other}` (use file:///path or s3://bucket/prefix)"),
                ));
            }
        };
        Ok(Self { inner, url: url.to_owned(), local: None })
    }

    /// The store in the local folder `root` (made when the first object is written).
    pub fn local(root: &Path) -> Self {
        let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
        let url = url::Url::from_directory_path(&root)
            .map_or_else(|()| format!("file://{}", root.display()), String::from);
        // Paths below the filesystem's root, so that nothing has to exist before the first
        // write (objects are written whole: staged beside their name, then renamed).
        let prefix = object_store::path::Path::from(root.to_string_lossy().as_ref());
        let inner = PrefixStore::new(LocalFileSystem::new(), prefix.clone());
        let url = url.trim_end_matches('/').to_owned();
        let local = Local { fs: Arc::new(LocalFileSystem::new()), prefix };
        Self { inner: Arc::new(inner), url, local: Some(local) }
    }

    /// The URL the store was opened with (a deployment's engines must share one).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes `bytes` as one object, whole or not at all.
    pub async fn put(&self, key: &BlobKey, bytes: Bytes) -> Result<BlobRef, BlobError> {
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let size = bytes.len() as u64;
        self.inner
            .put(&key.path(), PutPayload::from_bytes(bytes))
            .await
            .map_err(BlobError::backend("writing", key.as_str()))?;
        Ok(BlobRef { key: key.clone(), size, sha256 })
    }

    /// A writer that streams an object: nothing is visible under `key` until
    /// [`BlobWriter::finish`], and a writer dropped or aborted leaves nothing behind there.
    pub fn writer(&self, key: &BlobKey) -> BlobWriter {
        let part_bytes = if self.local.is_some() {
            crate::writer::LOCAL_PART_BYTES
        } else {
            crate::writer::S3_PART_BYTES
        };
        BlobWriter::new(Arc::clone(&self.inner), key.clone(), part_bytes)
    }

    /// Streams the local file at `path` into the object `key`.
    pub async fn put_file(&self, key: &BlobKey, path: &Path) -> Result<BlobRef, BlobError> {
        let read_error = |source| BlobError::Read { path: path.to_owned(), source };
        let mut file = tokio::fs::File::open(path).await.map_err(read_error)?;
        let mut writer = self.writer(key);
        let mut buf = vec![0u8; LOCAL_READ_BYTES];
        loop {
            let n = file.read(&mut buf).await.map_err(read_error)?;
            if n == 0 {
                break;
            }
            writer.write(&buf[..n]).await?;
        }
        writer.finish().await
    }

    /// The whole object.
    pub async fn get(&self, key: &BlobKey) -> Result<Bytes, BlobError> {
        let found = self.inner.get(&key.path()).await;
        let found = found.map_err(BlobError::backend("reading", key.as_str()))?;
        found.bytes().await.map_err(BlobError::backend("reading", key.as_str()))
    }

    /// Whether the store is a local folder.
    pub(crate) fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// Bytes `range` of the object (a request body or a result line by reference).
    pub async fn get_range(&self, key: &BlobKey, range: Range<u64>) -> Result<Bytes, BlobError> {
        self.inner
            .get_range(&key.path(), range)
            .await
            .map_err(BlobError::backend("reading", key.as_str()))
    }

    /// The object as a stream of chunks, never whole in memory. A local object is read from
    /// one open file in chunks of 256 KiB (the backend's own stream reads 8 KiB per hop to a
    /// blocking thread); the file stays the version opened even if the object is replaced.
    pub async fn stream(
        &self,
        key: &BlobKey,
    ) -> Result<BoxStream<'static, Result<Bytes, BlobError>>, BlobError> {
        let name = key.as_str().to_owned();
        if let Some(local) = &self.local {
            let local_error =
                |source| BlobError::Local { op: "reading", key: name.clone(), source };
            let file = match tokio::fs::File::open(local.file(key)?).await {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(BlobError::NotFound(name));
                }
                Err(source) => return Err(local_error(source)),
            };
            // A folder opens on some systems; it is not an object.
            if !file.metadata().await.map_err(local_error)?.is_file() {
                return Err(BlobError::NotFound(name));
            }
            let chunks = tokio_util::io::ReaderStream::with_capacity(file, LOCAL_READ_BYTES);
            return Ok(chunks
                .map_err(move |source| BlobError::Local {
                    op: "reading",
                    key: name.clone(),
                    source,
                })
                .boxed());
        }
        let found = self.inner.get(&key.path()).await;
        let found = found.map_err(BlobError::backend("reading", key.as_str()))?;
        Ok(found.into_stream().map_err(move |e| BlobError::backend("reading", &name)(e)).boxed())
    }

    /// The object's size, or `None` when there is no such object.
    pub async fn size(&self, key: &BlobKey) -> Result<Option<u64>, BlobError> {
        match self.inner.head(&key.path()).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => {
                Err(BlobError::Backend { op: "looking up", key: key.to_string(), source })
            }
        }
    }

    /// Deletes the object; one already gone counts as deleted. In a local folder, the staging
    /// files a writer killed mid-object left beside it (`NAME#N`, which listings never show)
    /// go too. (An S3 bucket's incomplete multipart uploads are its lifecycle rule's to abort.)
    pub async fn delete(&self, key: &BlobKey) -> Result<(), BlobError> {
        match self.inner.delete(&key.path()).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => {
                return Err(BlobError::Backend { op: "deleting", key: key.to_string(), source });
            }
        }
        if let Some(local) = &self.local {
            remove_staging(&local.file(key)?).await.map_err(|source| BlobError::Local {
                op: "deleting",
                key: key.to_string(),
                source,
            })?;
        }
        Ok(())
    }

    /// Every object under `prefix` (a key or a folder of keys), with its size, in key order.
    pub async fn list(&self, prefix: &BlobKey) -> Result<Vec<(BlobKey, u64)>, BlobError> {
        let mut found: Vec<(BlobKey, u64)> = self
            .inner
            .list(Some(&prefix.path()))
            .map_err(|e| BlobError::backend("listing", prefix.as_str())(e))
            .and_then(|meta| async move {
                let key = BlobKey::new(meta.location.as_ref())?;
                Ok((key, meta.size))
            })
            .try_collect()
            .await?;
        found.sort();
        Ok(found)
    }
}

/// Removes the staging files a killed writer left beside the object at `path`: `object_store`
/// names them `NAME#1`, `NAME#2`, ..., each writer taking the first free number, so leftovers
/// run from `#1` up and the first number missing ends them (the folder is never listed).
async fn remove_staging(path: &Path) -> std::io::Result<()> {
    for n in 1u32.. {
        let mut staged = path.as_os_str().to_owned();
        staged.push(format!("#{n}"));
        match tokio::fs::remove_file(&staged).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
