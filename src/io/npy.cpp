#include "io/npy.h"

#include <fstream>

#include "core/error.h"

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
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot write {}", path.string());
  const uint16_t len = uint16_t(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.put(char(len & 0xff));
  f.put(char(len >> 8));
  f << header;
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n * 4));
  if (!f) fail("short write to {}", path.string());
}

}  // namespace vlm
