package org.epochal.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * Hadoop's local file system ({@code FileSystem} API: checksum files over the raw local file
 * system) with {@link NioRawLocalFileSystem} as the raw layer: it starts no process to read a
 * link's status or set a permission. Spark's state stores copy their files with it.
 */
public class NioLocalFileSystem extends LocalFileSystem {

  public NioLocalFileSystem() {
    super(new NioRawLocalFileSystem());
  }
}
