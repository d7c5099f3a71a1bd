#pragma once
// Upstream (BFL) FLUX.2 transformer names -> diffusers', for tests of the loader's mapping back.
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace infill::test {

// diffusers' scripts/convert_flux2_to_diffusers.py (huggingface/diffusers 207bae7), applied
// forward to upstream names as that script does: renames, q/k/v split, final-layer
// (shift, scale) -> (scale, shift). The loader must undo it.
inline std::vector<std::pair<std::string, at::Tensor>> to_diffusers(const std::vector<std::pair<std::string, at::Tensor>>& upstream) {
  const std::vector<std::pair<std::string, std::string>> renames = {
      {"img_in", "x_embedder"},
      {"txt_in", "context_embedder"},
      {"time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1"},
      {"time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2"},
      {"guidance_in.in_layer", "time_guidance_embed.guidance_embedder.linear_1"},
      {"guidance_in.out_layer", "time_guidance_embed.guidance_embedder.linear_2"},
      {"double_stream_modulation_img.lin", "double_stream_modulation_img.linear"},
      {"double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear"},
      {"single_stream_modulation.lin", "single_stream_modulation.linear"},
      {"final_layer.linear", "proj_out"}};
  const std::vector<std::pair<std::string, std::string>> double_map = {
      {"img_attn.norm.query_norm", "attn.norm_q"},        {"img_attn.norm.key_norm", "attn.norm_k"},
      {"img_attn.proj", "attn.to_out.0"},                 {"img_mlp.0", "ff.linear_in"},
      {"img_mlp.2", "ff.linear_out"},                     {"txt_attn.norm.query_norm", "attn.norm_added_q"},
      {"txt_attn.norm.key_norm", "attn.norm_added_k"},    {"txt_attn.proj", "attn.to_add_out"},
      {"txt_mlp.0", "ff_context.linear_in"},              {"txt_mlp.2", "ff_context.linear_out"}};
  const std::vector<std::pair<std::string, std::string>> single_map = {{"linear1", "attn.to_qkv_mlp_proj"},
                                                                       {"linear2", "attn.to_out"},
                                                                       {"norm.query_norm", "attn.norm_q"},
                                                                       {"norm.key_norm", "attn.norm_k"}};
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [key, tensor] : upstream) {
    const size_t dot = key.rfind('.');
    std::string base = key.substr(0, dot), param = key.substr(dot + 1);
    if (param == "scale") param = "weight";
    if (base == "final_layer.adaLN_modulation.1") {
      const auto halves = tensor.chunk(2, 0);
      out.emplace_back("norm_out.linear.weight", at::cat({halves[1], halves[0]}).contiguous());
      continue;
    }
    bool done = false;
    for (const auto& [from, to] : renames) {
      if (base == from) {
        out.emplace_back(to + "." + param, tensor);
        done = true;
      }
    }
    if (done) continue;
    const bool is_double = base.rfind("double_blocks.", 0) == 0;
    constexpr size_t kHead = 14;  // strlen("double_blocks.") == strlen("single_blocks.")
    const size_t idx_end = base.find('.', kHead);
    const std::string idx = base.substr(kHead, idx_end - kHead);
    const std::string within = base.substr(idx_end + 1);
    if (is_double) {
      if (within == "img_attn.qkv" || within == "txt_attn.qkv") {
        const auto qkv = tensor.chunk(3, 0);
        const bool img = within[0] == 'i';
        const std::vector<std::string> names = img ? std::vector<std::string>{"attn.to_q", "attn.to_k", "attn.to_v"}
                                                   : std::vector<std::string>{"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
        for (int i = 0; i < 3; ++i) out.emplace_back("transformer_blocks." + idx + "." + names[i] + "." + param, qkv[i].contiguous());
        continue;
      }
      for (const auto& [from, to] : double_map) {
        if (within == from) out.emplace_back("transformer_blocks." + idx + "." + to + "." + param, tensor);
      }
    } else {
      for (const auto& [from, to] : single_map) {
        if (within == from) out.emplace_back("single_transformer_blocks." + idx + "." + to + "." + param, tensor);
      }
    }
  }
  return out;
}

}  // namespace infill::test
