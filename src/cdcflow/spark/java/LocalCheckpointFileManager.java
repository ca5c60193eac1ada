/*
 * Spark's checkpoint file manager for FileContext, with the three calls that start a process
 * on a local path made through java.nio instead (see cdcflow/spark/checkpoint_files.py).
 *
 * Without Hadoop's native library, which pip's pyspark lacks, Hadoop's local file system
 * starts `chmod` to set a new file's or folder's permission, and `readlink` twice to check a
 * rename's source and target for links. Spark writes each checkpoint entry aside and renames
 * it, so every entry started three processes. Here the entry is written with a buffered
 * FileOutputStream, renamed with rename(2) (overwrite) or link(2) then unlink(2) (no
 * overwrite: an existing target is refused atomically, as Spark expects; where the file
 * system has no links, Spark's own rename), and folders are made with mkdir(2). New files
 * and folders get the process's umask, not Hadoop's fs.permissions.umask-mode. Every other
 * call on a local path is Spark's FileContext-based manager's. A manager for a path that is
 * not local hands every call to the manager Spark itself would choose for it.
 */
package cdcflow.jvm;

import java.io.BufferedOutputStream;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;

public class LocalCheckpointFileManager extends FileContextBasedCheckpointFileManager {

    private static final String MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass";
    private static final Path LOCAL_ROOT = new Path("file:///");

    /** Spark's own manager for a path that is not local; null for a local one. */
    private final CheckpointFileManager other;

    public LocalCheckpointFileManager(Path path, Configuration hadoopConf) {
        super(isLocal(path, hadoopConf) ? path : LOCAL_ROOT, hadoopConf);
        other = isLocal(path, hadoopConf) ? null : sparksOwn(path, hadoopConf);
    }

    private static boolean isLocal(Path path, Configuration hadoopConf) {
        String scheme = path.toUri().getScheme();
        if (scheme == null) {
            scheme = FileSystem.getDefaultUri(hadoopConf).getScheme();
        }
        return "file".equals(scheme);
    }

    private static CheckpointFileManager sparksOwn(Path path, Configuration hadoopConf) {
        Configuration withoutUs = new Configuration(hadoopConf);
        withoutUs.unset(MANAGER_KEY);
        return CheckpointFileManager.create(path, withoutUs);
    }

    private File localFile(Path path) {
        return new File(fc().makeQualified(path).toUri().getPath());
    }

    @Override
    public FSDataOutputStream createTempFile(Path path) {
        try {
            return new FSDataOutputStream(
                new BufferedOutputStream(new FileOutputStream(localFile(path))), null);
        } catch (IOException error) {
            throw unchecked(error);
        }
    }

    @Override
    public void renameTempFile(Path source, Path target, boolean overwriteIfPossible) {
        java.nio.file.Path from = localFile(source).toPath();
        java.nio.file.Path to = localFile(target).toPath();
        try {
            if (overwriteIfPossible) {
                Files.move(from, to, StandardCopyOption.ATOMIC_MOVE);
                return;
            }
            try {
                Files.createLink(to, from);
            } catch (java.nio.file.FileAlreadyExistsException exists) {
                throw new FileAlreadyExistsException(
                    "Rename destination " + target + " already exists.");
            } catch (IOException | UnsupportedOperationException noLinks) {
                super.renameTempFile(source, target, false);  // a file system without links
                return;
            }
            Files.delete(from);
        } catch (IOException error) {
            throw unchecked(error);
        }
    }

    @Override
    public void mkdirs(Path path) {
        if (other != null) {
            other.mkdirs(path);
            return;
        }
        try {
            Files.createDirectories(localFile(path).toPath());
        } catch (IOException error) {
            throw unchecked(error);
        }
    }

    @Override
    public CheckpointFileManager.CancellableFSDataOutputStream createAtomic(
            Path path, boolean overwriteIfPossible) {
        return other != null ? other.createAtomic(path, overwriteIfPossible)
            : super.createAtomic(path, overwriteIfPossible);
    }

    @Override
    public FSDataInputStream open(Path path) {
        return other != null ? other.open(path) : super.open(path);
    }

    @Override
    public FileStatus[] list(Path path, PathFilter filter) {
        return other != null ? other.list(path, filter) : super.list(path, filter);
    }

    @Override
    public FileStatus[] list(Path path) {
        return other != null ? other.list(path) : super.list(path);
    }

    @Override
    public boolean exists(Path path) {
        return other != null ? other.exists(path) : super.exists(path);
    }

    @Override
    public void delete(Path path) {
        if (other != null) {
            other.delete(path);
        } else {
            super.delete(path);
        }
    }

    @Override
    public boolean isLocal() {
        return other != null ? other.isLocal() : super.isLocal();
    }

    @Override
    public Path createCheckpointDirectory() {
        return other != null ? other.createCheckpointDirectory()
            : super.createCheckpointDirectory();
    }

    @Override
    public void close() {
        if (other != null) {
            other.close();
        }
        super.close();
    }

    /** Throw a checked exception from a method whose Scala signature declares none, as
     * Spark's own manager does. */
    private static RuntimeException unchecked(IOException error) {
        LocalCheckpointFileManager.<RuntimeException>raise(error);
        return new IllegalStateException(error);
    }

    @SuppressWarnings("unchecked")
    private static <T extends Throwable> void raise(Throwable error) throws T {
        throw (T) error;
    }
}
