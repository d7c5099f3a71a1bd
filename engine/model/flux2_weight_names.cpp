#include "model/flux2_weight_names.h"

#include <regex>
#include <tuple>
#include <utility>
#include <vector>

namespace infill {

namespace {

// Renames of diffusers' conversion, inverted: diffusers name (without prefix) -> upstream.
// Block-level names carry the block index in a capture group.
struct Rename {
  std::regex pattern;
  std::string upstream;  // "$1" is the block index
  UpstreamWeight::Part part = UpstreamWeight::Part::kWhole;
};

const std::vector<Rename>& diffusers_renames() {
  using Part = UpstreamWeight::Part;
  static const std::vector<Rename> renames = [] {
    const std::vector<std::tuple<std::string, std::string, Part>> table = {
        {R"(x_embedder\.weight)", "img_in.weight", Part::kWhole},
        {R"(context_embedder\.weight)", "txt_in.weight", Part::kWhole},
        {R"(time_guidance_embed\.timestep_embedder\.linear_1\.weight)", "time_in.in_layer.weight", Part::kWhole},
        {R"(time_guidance_embed\.timestep_embedder\.linear_2\.weight)", "time_in.out_layer.weight", Part::kWhole},
        {R"(time_guidance_embed\.guidance_embedder\.linear_1\.weight)", "guidance_in.in_layer.weight", Part::kWhole},
        {R"(time_guidance_embed\.guidance_embedder\.linear_2\.weight)", "guidance_in.out_layer.weight", Part::kWhole},
        {R"(double_stream_modulation_img\.linear\.weight)", "double_stream_modulation_img.lin.weight", Part::kWhole},
        {R"(double_stream_modulation_txt\.linear\.weight)", "double_stream_modulation_txt.lin.weight", Part::kWhole},
        {R"(single_stream_modulation\.linear\.weight)", "single_stream_modulation.lin.weight", Part::kWhole},
        {R"(proj_out\.weight)", "final_layer.linear.weight", Part::kWhole},
        {R"(norm_out\.linear\.weight)", "final_layer.adaLN_modulation.1.weight", Part::kSwappedHalves},
        {R"(transformer_blocks\.(\d+)\.attn\.to_q\.weight)", "double_blocks.$1.img_attn.qkv.weight", Part::kQ},
        {R"(transformer_blocks\.(\d+)\.attn\.to_k\.weight)", "double_blocks.$1.img_attn.qkv.weight", Part::kK},
        {R"(transformer_blocks\.(\d+)\.attn\.to_v\.weight)", "double_blocks.$1.img_attn.qkv.weight", Part::kV},
        {R"(transformer_blocks\.(\d+)\.attn\.add_q_proj\.weight)", "double_blocks.$1.txt_attn.qkv.weight", Part::kQ},
        {R"(transformer_blocks\.(\d+)\.attn\.add_k_proj\.weight)", "double_blocks.$1.txt_attn.qkv.weight", Part::kK},
        {R"(transformer_blocks\.(\d+)\.attn\.add_v_proj\.weight)", "double_blocks.$1.txt_attn.qkv.weight", Part::kV},
        {R"(transformer_blocks\.(\d+)\.attn\.norm_q\.weight)", "double_blocks.$1.img_attn.norm.query_norm.scale", Part::kWhole},
        {R"(transformer_blocks\.(\d+)\.attn\.norm_k\.weight)", "double_blocks.$1.img_attn.norm.key_norm.scale", Part::kWhole},
        {R"(transformer_blocks\.(\d+)\.attn\.to_out\.0\.weight)", "double_blocks.$1.img_attn.proj.weight", Part::kWhole},
        {R"(transformer_blocks\.(\d+)\.ff\.linear_in\.weight)", "double_blocks.$1.img_mlp.0.weight", Part::kWhole},
        {R"(transformer_blocks\.(\d+)\.ff\.linear_out\.weight)", "double_blocks.$1.img_mlp.2.weight", Part::kWhole},
        {R"(transformer_blocks\.(\d+)\.attn\.norm_added_q\.weight)", "double_blocks.$1.txt_attn.norm.query_norm.scale", Part::kWhole},
        {R"(transformer_blocks\.(\d+)\.attn\.norm_added_k\.weight)", "double_blocks.$1.txt_attn.norm.key_norm.scale", Part::kWhole},
        {R"(transformer_blocks\.(\d+)\.attn\.to_add_out\.weight)", "double_blocks.$1.txt_attn.proj.weight", Part::kWhole},
        {R"(transformer_blocks\.(\d+)\.ff_context\.linear_in\.weight)", "double_blocks.$1.txt_mlp.0.weight", Part::kWhole},
        {R"(transformer_blocks\.(\d+)\.ff_context\.linear_out\.weight)", "double_blocks.$1.txt_mlp.2.weight", Part::kWhole},
        {R"(single_transformer_blocks\.(\d+)\.attn\.to_qkv_mlp_proj\.weight)", "single_blocks.$1.linear1.weight", Part::kWhole},
        {R"(single_transformer_blocks\.(\d+)\.attn\.to_out\.weight)", "single_blocks.$1.linear2.weight", Part::kWhole},
        {R"(single_transformer_blocks\.(\d+)\.attn\.norm_q\.weight)", "single_blocks.$1.norm.query_norm.scale", Part::kWhole},
        {R"(single_transformer_blocks\.(\d+)\.attn\.norm_k\.weight)", "single_blocks.$1.norm.key_norm.scale", Part::kWhole},
    };
    std::vector<Rename> out;
    for (const auto& [from, to, part] : table) out.push_back({std::regex(from), to, part});
    return out;
  }();
  return renames;
}

}  // namespace

std::optional<UpstreamWeight> upstream_weight_of_diffusers(const std::string& diffusers_name) {
  std::smatch m;
  for (const Rename& r : diffusers_renames()) {
    if (std::regex_match(diffusers_name, m, r.pattern)) return UpstreamWeight{m.format(r.upstream), r.part};
  }
  return std::nullopt;
}

}  // namespace infill
