/*
 * Spark's checkpoint file manager for FileContext, with the three calls that start a process
 * on a local path made through java.nio instead (see cdcflow/spark/checkpoint_files.py).
 *
 * Without Hadoop's native library, which pip's pyspark lacks, Hadoop's local file system
 * starts `chmod` to set a new file's or folder's permission, and `readlink` twice to check a
 * rename's source and target for links. Spark writes each checkpoint entry aside and renames
 * it, so every entry started three processes. Here the entry is written with a
 * FileOutputStream, renamed with rename(2) (overwrite) or link(2) then unlink(2) (no
 * overwrite: an existing target is refused atomically, as Spark expects; where the file
 * system has no links, Spark's own rename), and folders are made with mkdir(2). Permissions follow the umask, as Hadoop's defaults do. Every other call,
 * and every path that is not local, is Spark's own.
 */
package cdcflow.jvm;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;

public class LocalCheckpointFileManager extends FileContextBasedCheckpointFileManager {

    public LocalCheckpointFileManager(Path path, Configuration hadoopConf) {
        super(path, hadoopConf);
    }

    /** The local file of `path` (a scheme-less path is qualified by this manager's file
     * system), or null when it is not on the local file system. */
    private File localFile(Path path) {
        String scheme = fc().makeQualified(path).toUri().getScheme();
        return "file".equals(scheme) ? new File(path.toUri().getPath()) : null;
    }

    @Override
    public FSDataOutputStream createTempFile(Path path) {
        File file = localFile(path);
        if (file == null) {
            return super.createTempFile(path);
        }
        try {
            return new FSDataOutputStream(new FileOutputStream(file), null);
        } catch (IOException error) {
            throw unchecked(error);
        }
    }

    @Override
    public void renameTempFile(Path source, Path target, boolean overwriteIfPossible) {
        File from = localFile(source);
        File to = localFile(target);
        if (from == null || to == null) {
            super.renameTempFile(source, target, overwriteIfPossible);
            return;
        }
        try {
            if (overwriteIfPossible) {
                Files.move(from.toPath(), to.toPath(), StandardCopyOption.ATOMIC_MOVE);
                return;
            }
            try {
                Files.createLink(to.toPath(), from.toPath());
            } catch (java.nio.file.FileAlreadyExistsException exists) {
                throw new FileAlreadyExistsException(
                    "Rename destination " + target + " already exists.");
            } catch (IOException | UnsupportedOperationException noLinks) {
                super.renameTempFile(source, target, false);  // a file system without links
                return;
            }
            Files.delete(from.toPath());
        } catch (IOException error) {
            throw unchecked(error);
        }
    }

    @Override
    public void mkdirs(Path path) {
        File folder = localFile(path);
        if (folder == null) {
            super.mkdirs(path);
            return;
        }
        try {
            Files.createDirectories(folder.toPath());
        } catch (IOException error) {
            throw unchecked(error);
        }
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
