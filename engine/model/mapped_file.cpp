#include "engine/model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace fathom {
namespace {

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::unique_ptr<MappedFile> MappedFile::open(const std::string& path) {
  std::unique_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  const FdCloser fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st{};
  if (fstat(fd.fd, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path + ": cannot open: not a regular file");
  if (st.st_size > 0) {  // mmap rejects length 0
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (p == MAP_FAILED) throw Error(path + ": cannot mmap: " + std::strerror(errno));
    m->data_ = static_cast<const uint8_t*>(p);
    m->size_ = static_cast<size_t>(st.st_size);
  }
  return m;  // the fd closes here; the mapping stays valid without it
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

bool MappedFile::contains(const void* p, size_t bytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(data_);
  return data_ != nullptr && begin >= base && bytes <= size_ && begin - base <= size_ - bytes;
}

void MappedFile::release_pages(const void* p, size_t bytes) const {
  if (bytes == 0 || !contains(p, bytes)) return;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (begin + page - 1) / page * page, hi = (begin + bytes) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);  // advisory
}

}  // namespace fathom
