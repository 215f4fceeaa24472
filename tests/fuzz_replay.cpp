// A libFuzzer target (fuzz/*.cpp) without libFuzzer: tests/CMakeLists.txt links each target's
// LLVMFuzzerTestOneInput with this main and runs it in every CI run, so that the targets keep
// compiling against the library and their checks (std::abort where an invariant breaks) hold on
//   - every file under the paths given (the target's seeds, fuzz/seeds/NAME),
//   - each of them with bytes changed, words set to edge values or the tail cut off, and
//   - random byte strings,
// all drawn from one fixed seed. A fuzzing campaign runs the same targets under libFuzzer with
// sanitizers (fuzz/README.md); this is its smoke test, not a substitute.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// One change of a seed: a byte xored, a 32-bit word set to an edge value (sizes and counts in the
// binary formats), or the input cut short.
std::string mutate(std::string s, std::mt19937& rng) {
  if (s.empty()) return s;
  const size_t at = rng() % s.size();
  switch (rng() % 3) {
    case 0:
      s[at] = char(s[at] ^ char(1 + rng() % 255));
      break;
    case 1: {
      constexpr uint32_t kEdges[] = {0, 1, 0x7fffffffu, 0x80000000u, 0xffffffffu};
      const uint32_t v = kEdges[rng() % std::size(kEdges)];
      std::memcpy(s.data() + at, &v, std::min<size_t>(4, s.size() - at));
      break;
    }
    default:
      s.resize(at);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr int kChangesPerSeed = 256, kRandomInputs = 1024;
  constexpr size_t kRandomMaxBytes = 512;
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());  // the same order, so the same changes, on every machine
    } else {
      files.emplace_back(argv[i]);
    }
    for (const auto& f : files) seeds.push_back(read_file(f));
  }
  std::mt19937 rng(20261206);
  size_t runs = 0;
  auto run = [&](const std::string& s) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    ++runs;
  };
  for (const std::string& s : seeds) {
    run(s);
    for (int i = 0; i < kChangesPerSeed; ++i) run(mutate(s, rng));
  }
  for (int i = 0; i < kRandomInputs; ++i) {
    std::string s(rng() % (kRandomMaxBytes + 1), '\0');
    for (char& c : s) c = char(rng());
    run(s);
  }
  std::printf("%zu inputs from %zu seeds: every check held\n", runs, seeds.size());
  return 0;
}
