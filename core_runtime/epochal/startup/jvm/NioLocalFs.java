package org.epochal.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.local.LocalConfigKeys;

/**
 * Hadoop's {@code file:} file system for {@code FileContext} (its {@code LocalFs}: checksum
 * files over the raw local file system) with {@link NioRawLocalFileSystem} as the raw layer.
 *
 * <p>Spark writes a streaming query's checkpoint (offset log, commit log, metadata, state
 * store files) through {@code FileContext}, so this is the class that decides how many
 * processes a micro-batch starts. Set as {@code fs.AbstractFileSystem.file.impl}.
 */
public class NioLocalFs extends ChecksumFs {

  public NioLocalFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(new Raw(uri, conf));
  }

  /** Hadoop's {@code RawLocalFs}, delegating to {@link NioRawLocalFileSystem}. */
  static final class Raw extends DelegateToFileSystem {

    Raw(URI uri, Configuration conf) throws IOException, URISyntaxException {
      super(uri, new NioRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
    }

    @Override
    public int getUriDefaultPort() {
      return -1; // no port
    }

    @Override
    public FsServerDefaults getServerDefaults(Path f) throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    @Deprecated
    public FsServerDefaults getServerDefaults() throws IOException {
      return LocalConfigKeys.getServerDefaults();
    }

    @Override
    public boolean isValidName(String src) {
      return true; // any local path
    }
  }
}
