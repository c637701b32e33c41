package org.epochal.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's raw local file system, except that it asks the operating system through {@code
 * java.nio} where Hadoop without its native library starts a process.
 *
 * <p>Without {@code libhadoop} (pip's pyspark ships none), Hadoop's local file system reads a
 * path's link status by running {@code readlink} and sets a new file's permissions by running
 * {@code chmod}. Spark writes each entry of a streaming query's offset and commit logs as a
 * temporary file (two {@code chmod}: the file and its checksum) renamed into place (eight
 * {@code readlink}: source, destination and parent, for the file and its checksum): about
 * twenty processes per micro-batch on the driver, 50-80 ms of each batch (the offset and the
 * commit log writes) on a 2-core machine, 1-2 ms each without them.
 *
 * <p>Here a path that is not a symbolic link gets its status as Hadoop gets it for one
 * ({@code readlink} printed nothing), and permissions are set with {@link
 * Files#setPosixFilePermissions}, which follows links as {@code chmod} does. A symbolic link,
 * a sticky bit, or a machine with Hadoop's native library get Hadoop's own code.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    return getFileStatus(f); // not a link (or absent: Hadoop's FileNotFoundException)
  }

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    if (NativeIO.isAvailable() || permission.getStickyBit()) {
      super.setPermission(p, permission);
      return;
    }
    String symbols =
        permission.getUserAction().SYMBOL
            + permission.getGroupAction().SYMBOL
            + permission.getOtherAction().SYMBOL;
    Files.setPosixFilePermissions(
        pathToFile(p).toPath(), PosixFilePermissions.fromString(symbols));
  }
}
