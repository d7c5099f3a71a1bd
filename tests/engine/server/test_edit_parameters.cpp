// The engine's parser of POST /v1/edits takes every parameter's type and range from the one
// parameter table (protocol/infill_protocol/edit_parameters.h).
#include <fstream>
#include <iterator>

#include <infill_protocol/edit_parameters.h>

#include "server_fixture.h"

using namespace infill;
using namespace infill::test;
namespace proto = infill::protocol;

TEST_CASE("POST /v1/edits refuses each table parameter just outside its range, naming the range", "[server][params]") {
  ServerFixture f;
  const std::string tmpl = f.upload();
  auto submit = [&](const nlohmann::json& extra) {
    nlohmann::json body = {{"template", tmpl}, {"mask_rect", {8, 8, 16, 16}}, {"steps", 2}};
    body.update(extra);
    return request(f.unix_ep, "POST", "/v1/edits", body.dump(), {"Content-Type: application/json"});
  };
  int numeric = 0;
  for (const proto::EditParameter& p : proto::kEditParameters) {
    if (!(p.clients & proto::kApi)) continue;
    const std::string name(p.name);
    INFO(name);
    if (p.type == proto::ParamType::kInteger || p.type == proto::ParamType::kNumber) {
      ++numeric;
      const double step = p.type == proto::ParamType::kInteger ? 1.0 : 0.5;
      const nlohmann::json above = p.type == proto::ParamType::kInteger ? nlohmann::json(int64_t(p.max) + 1) : nlohmann::json(p.max + step);
      const nlohmann::json below = p.type == proto::ParamType::kInteger ? nlohmann::json(int64_t(p.min) - 1) : nlohmann::json(p.min - step);
      std::vector<nlohmann::json> bad_values = {above, below};
      if (p.min_exclusive) bad_values.push_back(p.min);  // the open end itself
      for (const nlohmann::json& bad : bad_values) {
        Response r = submit({{name, bad}});
        INFO(r.body);
        CHECK(r.status == 400);
        CHECK(r.json()["error"]["code"] == "invalid_parameter");
        CHECK(r.json()["error"]["message"].get<std::string>() == name + " is " + bad.dump() + ", expected " + proto::range_text(p));
      }
      Response wrong_type = submit({{name, "3"}});
      CHECK(wrong_type.status == 400);
      CHECK(wrong_type.json()["error"]["message"].get<std::string>().rfind(name + " must be", 0) == 0);
    } else if (p.type == proto::ParamType::kEnum) {
      Response r = submit({{name, "nonsense"}});
      CHECK(r.status == 400);
      CHECK(r.json()["error"]["message"].get<std::string>() == name + " is \"nonsense\", expected one of " + std::string(p.choices));
    } else if (p.type == proto::ParamType::kString && p.max_length > 0) {
      Response r = submit({{name, std::string(p.max_length + 1, 'a')}});
      CHECK(r.status == 400);
      CHECK(r.json()["error"]["message"].get<std::string>().find("expected at most " + std::to_string(p.max_length)) !=
            std::string::npos);
    }
  }
  CHECK(numeric == 10);
  // An unknown key is refused with the table's API names as the list of known ones.
  Response unknown = submit({{"halo", 2}});
  REQUIRE(unknown.status == 400);
  const std::string message = unknown.json()["error"]["message"];
  for (const proto::EditParameter& p : proto::kEditParameters)
    if (p.clients & proto::kApi) CHECK(message.find(std::string(p.name)) != std::string::npos);
  // The top of each range is accepted (the edit is queued).
  Response top = submit({{"halo_tokens", int64_t(proto::edit_parameter("halo_tokens").max)},
                         {"feather_px", proto::edit_parameter("feather_px").max},
                         {"seed", int64_t(proto::edit_parameter("seed").max)}});
  INFO(top.body);
  CHECK(top.status == 202);
}

TEST_CASE("docs/api.md's parameter table states each API parameter's range from the table", "[server][params][docs]") {
  std::ifstream in(std::string(INFILL_SOURCE_DIR) + "/docs/api.md");
  REQUIRE(in);
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const proto::EditParameter& p : proto::kEditParameters) {
    if (!(p.clients & proto::kApi) || p.name.rfind("mask", 0) == 0) continue;
    const std::string name(p.name);
    INFO(name);
    const size_t row = doc.find("| `" + name + "` |");
    REQUIRE(row != std::string::npos);
    const std::string line = doc.substr(row, doc.find('\n', row) - row);
    INFO(line);
    if (p.type == proto::ParamType::kInteger || p.type == proto::ParamType::kNumber) {
      CHECK(line.find(proto::range_text(p)) != std::string::npos);
    } else if (p.type == proto::ParamType::kEnum) {
      std::string escaped;  // '|' is written \| inside a Markdown table
      for (char c : p.choices) escaped += c == '|' ? std::string("\\|") : std::string(1, c);
      CHECK(line.find("one of " + escaped) != std::string::npos);
    } else if (p.type == proto::ParamType::kAdapterList) {
      CHECK(line.find("at most " + std::to_string(p.max_length) + " adapters") != std::string::npos);
      CHECK(line.find("strength " + proto::range_text(p)) != std::string::npos);
    } else if (p.type == proto::ParamType::kTemplateList) {
      CHECK(line.find("at most " + std::to_string(p.max_length) + " template ids") != std::string::npos);
    } else if (p.max_length > 0) {
      CHECK(line.find("at most " + std::to_string(p.max_length) + " bytes") != std::string::npos);
    }
  }
}
