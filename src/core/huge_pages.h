// Large activation buffers: std::vector with an allocator that maps arrays of 2 MiB and more as
// anonymous memory advised MADV_HUGEPAGE, so that the first touch faults in 2 MiB pages rather
// than 4 KiB ones, and that leaves elements default-initialised (for float: not written; a fresh
// mapping reads as zeros). The SigLIP activations of one 896x896 image (165 MB) took 0.52 s to
// zero as a std::vector on a 2-core VM, most of it in page faults; mapped this way, 15 ms.
// Smaller arrays come from operator new.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <new>
#include <utility>
#include <vector>

namespace vlm {

template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHugePage = size_t(2) << 20;

  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return static_cast<T*>(::operator new(bytes, std::align_val_t(64)));
    void* p = ::mmap(nullptr, mapped(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    ::madvise(p, mapped(bytes), MADV_HUGEPAGE);  // a hint: without THP the pages stay 4 KiB
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePage) return ::operator delete(p, std::align_val_t(64));
    ::munmap(p, mapped(bytes));
  }
  // resize() default-initialises new elements instead of zeroing them.
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }

 private:
  static size_t mapped(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
};

template <class T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace vlm
