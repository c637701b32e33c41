package org.epochal.hadoop;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import org.apache.hadoop.fs.Path;

/**
 * Hadoop's local file system, except that a RocksDB table file ({@code .sst}) that a Spark
 * state store copies between its checkpoint and its local working directory is hard-linked
 * instead of copied, when both ends are on one file system.
 *
 * <p>Spark's RocksDB state store copies every table file of the version it loads from the
 * checkpoint into a new local directory whenever a query run opens a state store partition
 * (every restart, in place or in a new driver), and every new table file back to the
 * checkpoint at each commit. A table file is never changed once written (RocksDB's own
 * checkpoints hard-link them for that reason; it deletes them, never rewrites them, and
 * does not truncate a file that has another link), and Spark gives each checkpoint copy a
 * unique name and only ever deletes it. So a link serves exactly like a copy, and costs
 * nothing per byte: a restart no longer reads and writes the whole state.
 *
 * <p>Anything else (another file, a move, ends on different file systems, a link the file
 * system refuses) is copied as {@link NioLocalFileSystem} copies it.
 */
public class LinkingLocalFileSystem extends NioLocalFileSystem {

  /** The only files linked: RocksDB's immutable table files. */
  static final String TABLE_FILE_SUFFIX = ".sst";

  @Override
  public void copyToLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    if (delSrc || !link(src, dst)) {
      super.copyToLocalFile(delSrc, src, dst);
    }
  }

  @Override
  public void copyFromLocalFile(boolean delSrc, Path src, Path dst) throws IOException {
    if (delSrc || !link(src, dst)) {
      super.copyFromLocalFile(delSrc, src, dst);
    }
  }

  /** Hard-links {@code dst} to {@code src}; false (nothing done) when it does not apply. */
  private boolean link(Path src, Path dst) {
    if (!src.getName().endsWith(TABLE_FILE_SUFFIX) || !dst.getName().endsWith(TABLE_FILE_SUFFIX)) {
      return false;
    }
    try {
      File source = pathToFile(src);
      File target = pathToFile(dst);
      if (!source.isFile()) {
        return false;
      }
      if (target.exists()) {
        delete(dst, false); // a copy overwrites: so does a link (and its checksum file goes)
      }
      File parent = target.getParentFile();
      if (parent != null) {
        Files.createDirectories(parent.toPath());
      }
      Files.createLink(target.toPath(), source.toPath());
      return true;
    } catch (IOException | RuntimeException e) {
      return false; // another file system, links refused: the copy does it
    }
  }
}
