#include "tensorwire/wire/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "bytes.h"
#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/layout.h"

namespace tensorwire {

namespace {

void write_all(int fd, const void* data, size_t n, const std::string& where) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw SystemError(where, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// A temporary file beside `path`, this call's own: saves to one path from two threads or
// processes each write a file of their own, and the last rename wins whole. Created with
// O_EXCL under a name no other call of this process uses (pid and a counter); a name left
// by a crashed process of the same pid is skipped. Mode 0644 less the umask, as open()
// applies it.
int create_temporary(const std::string& path, std::string& tmp) {
  static std::atomic<uint64_t> next{0};
  while (true) {
    tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(next++);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
}

// The system takes a path up to its first NUL: one inside would name another file.
void check_path(const std::string& path, const char* call) {
  if (path.empty()) throw ValueError(std::string(call) + ": the path is empty");
  if (path.find('\0') != std::string::npos)
    throw ValueError(std::string(call) + ": the path holds a NUL byte");
}

}  // namespace

void save(const TensorDict& td, const std::string& path, const ConsolidateOptions& options) {
  check_path(path, "save");
  TensorDict c = consolidate(td, options);
  const std::string json = c.consolidated()->metadata->dump();
  const Storage& storage = c.consolidated()->storage;
  std::byte trailer[8];
  wire::detail::store_le<uint64_t>(trailer, json.size());

  // Every error names the path the caller gave (the temporary file is ours, not theirs).
  const std::string where = "cannot save to '" + path + "'";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw SystemError(where, EISDIR);
  // Write beside the target and rename: readers never see a half-written file.
  std::string tmp;
  int fd = create_temporary(path, tmp);
  if (fd < 0) throw SystemError(where + " (creating '" + tmp + "')", errno);
  try {
    write_all(fd, storage.data(), storage.nbytes(), where);
    write_all(fd, json.data(), json.size(), where);
    write_all(fd, trailer, sizeof trailer, where);
    if (::fsync(fd) != 0) throw SystemError(where + " (sync)", errno);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw SystemError(where + " (renaming '" + tmp + "' into place)", err);
  }
}

TensorDict load(const std::string& path, const wire::Limits& limits) {
  check_path(path, "load");
  Storage file = Storage::map_file(path);
  const uint64_t size = file.nbytes();
  auto bad = [&](const std::string& rule) {
    return ProtocolError("cannot load '" + path + "': " + rule);
  };
  if (size < 8)
    throw bad("truncated file: " + std::to_string(size) +
              " bytes, a saved TensorDict ends with an 8-byte metadata length");
  const uint64_t json_len = wire::detail::load_le<uint64_t>(file.data() + size - 8);
  if (json_len > size - 8)
    throw bad("metadata length " + std::to_string(json_len) + " is larger than the file (" +
              std::to_string(size) + " bytes): truncated or not a saved TensorDict");
  if (json_len > limits.max_metadata_bytes)
    throw bad("metadata length " + std::to_string(json_len) + " exceeds the limit of " +
              std::to_string(limits.max_metadata_bytes));
  const uint64_t storage_bytes = size - 8 - json_len;
  // The storage is the mapped file's first storage_bytes; it keeps the mapping alive.
  Storage storage = Storage::external(
      file.data(), storage_bytes, [file] {}, Storage::Kind::Mapped);
  try {
    Json meta =
        wire::parse_untrusted_json({file.data() + storage_bytes, json_len}, limits, "metadata");
    return wire::view_consolidated(std::move(storage), std::move(meta), limits);
  } catch (const ProtocolError& e) {
    throw bad(e.what());
  }
}

}  // namespace tensorwire
