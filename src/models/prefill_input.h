// The one door into the decoder's prefill (see models/gemma3.h).
#pragma once
#include <vector>

namespace vlm {

struct PrefillInput {
  std::vector<float> embeds;        // [Lp, H], post-scale (the decoder never scales again)
  std::vector<float> mask_global;   // [Lp, Lp] additive (canonical shape [1,1,Lp,Lp])
  std::vector<float> mask_sliding;  // [Lp, Lp]; empty = mask_global serves sliding layers
  int Lp = 0;
  int valid_len = 0;  // rows 0..valid_len-1 are real tokens; the rest is right padding
};

}  // namespace vlm
