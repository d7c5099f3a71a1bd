// parse_edit_request on its own (no engine): the fields it reads, and the first problem it
// names, with the parameter and what was expected.
#include "support/catch.h"

#include "server/edit_request.h"

using namespace infill;
using nlohmann::json;

namespace {

std::string refusal(const json& params, std::string mask_part = {}) {
  auto r = parse_edit_request(params, std::move(mask_part));
  const ApiReply* reply = std::get_if<ApiReply>(&r);
  REQUIRE(reply != nullptr);
  CHECK(reply->status == 400);
  return json::parse(reply->body)["error"]["message"].get<std::string>();
}

}  // namespace

TEST_CASE("parse_edit_request reads every field, and the mask from exactly one source", "[server][params]") {
  auto r = parse_edit_request({{"template", "t1"}, {"prompt", "make it red"}, {"seed", 7}, {"steps", 12},
                               {"strength", 0.5}, {"guidance", 4.5}, {"class", "batch"}, {"sampler", "ddim"},
                               {"deadline_ms", 2500}, {"preview_every_steps", 2}, {"supersedes", 3},
                               {"halo_tokens", 2}, {"feather_px", 1.5}, {"model", "m"}, {"mask_rect", {1, 2, 3, 4}}},
                              "");
  REQUIRE(std::holds_alternative<EditRequestFields>(r));
  const EditRequestFields& f = std::get<EditRequestFields>(r);
  CHECK(f.template_id == "t1");
  CHECK(f.prompt == "make it red");
  CHECK(f.model == "m");
  CHECK(f.sampler == "ddim");
  CHECK(f.cls == RequestClass::kBatch);
  CHECK(*f.seed == 7);
  CHECK(*f.steps == 12);
  CHECK(*f.strength == 0.5);
  CHECK(*f.guidance == 4.5);
  CHECK(*f.deadline_ms == 2500);
  CHECK(*f.preview_every_steps == 2);
  CHECK(*f.supersedes == 3);
  CHECK(*f.halo_tokens == 2);
  CHECK(*f.feather_px == 1.5);
  CHECK(f.mask_rect == json({1, 2, 3, 4}));
  CHECK(f.mask_bytes.empty());

  // base64 is decoded; a multipart part is taken as is; the defaults stay unset.
  auto b = parse_edit_request({{"template", "t"}, {"mask_png_base64", "aGVsbG8="}}, "");
  REQUIRE(std::holds_alternative<EditRequestFields>(b));
  CHECK(std::get<EditRequestFields>(b).mask_bytes == "hello");
  CHECK(std::get<EditRequestFields>(b).cls == RequestClass::kInteractive);
  CHECK_FALSE(std::get<EditRequestFields>(b).seed.has_value());
  auto m = parse_edit_request({{"template", "t"}}, "PNGBYTES");
  REQUIRE(std::holds_alternative<EditRequestFields>(m));
  CHECK(std::get<EditRequestFields>(m).mask_bytes == "PNGBYTES");
  CHECK(std::get<EditRequestFields>(m).mask_rect.is_null());
}

TEST_CASE("parse_edit_request names the parameter at fault and what was expected", "[server][params]") {
  CHECK(refusal(json::array()) == "edit parameters must be a JSON object");
  CHECK(refusal({{"mask_rect", {0, 0, 1, 1}}}).find("template is required") == 0);
  CHECK(refusal({{"template", "t"}, {"mask_rect", {0, 0, 1, 1}}, {"colour", "red"}}).find("edit parameter 'colour' is not known") == 0);
  CHECK(refusal({{"template", "t"}, {"mask_rect", {0, 0, 1, 1}}, {"halo_tokens", 65}}) == "halo_tokens is 65, expected 0..64");
  CHECK(refusal({{"template", "t"}, {"mask_rect", {0, 0, 1, 1}}, {"strength", 0}}) == "strength is 0, expected (0, 1]");
  CHECK(refusal({{"template", "t"}, {"mask_rect", {0, 0, 1, 1}}, {"steps", 2.5}}) == "steps must be an integer");
  CHECK(refusal({{"template", "t"}, {"mask_rect", {0, 0, 1, 1}}, {"class", "urgent"}}) ==
        "class is \"urgent\", expected one of live|interactive|batch");
  CHECK(refusal({{"template", "t"}}) == "a mask is required: a 'mask' file part, mask_png_base64 or mask_rect");
  CHECK(refusal({{"template", "t"}, {"mask_rect", {0, 0, 1, 1}}}, "PNG") ==
        "give exactly one of: a 'mask' file part, mask_png_base64, mask_rect");
  CHECK(refusal({{"template", "t"}, {"mask_png_base64", "@@@"}}).find("mask_png_base64: ") == 0);
}
