#include "io/npy.h"

#include "io/file.h"

namespace vlm {

void write_npy(const std::filesystem::path& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ",";
    n *= d;
  }
  if (shape.size() > 1) dims.pop_back();  // "(3,)" for 1-D, "(2,3)" otherwise
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic(6) + version(2) + len(2) + header + '\n' padded to a multiple of 64
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const uint16_t len = uint16_t(header.size());
  const char lead[10] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0, char(len & 0xff), char(len >> 8)};
  AtomicWriter f(path);
  f.write(lead, sizeof lead);
  f.write(header);
  f.write(data, size_t(n) * 4);
  f.commit();
}

}  // namespace vlm
