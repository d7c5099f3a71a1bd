// GET /v1/openapi.json: valid OpenAPI 3.1 by a real validator (@seriousme/openapi-schema-
// validator, tests/reference/openapi, run unmodified with node), and generated from the
// tables the engine itself dispatches by.
#include <infill_protocol/edit_parameters.h>

#include <filesystem>
#include <fstream>

#include "server/api_routes.h"
#include "server_fixture.h"
#include "support/command_output.h"

using namespace infill;
using namespace infill::test;

namespace {

const std::string kValidator = std::string(INFILL_SOURCE_DIR) + "/tests/reference/openapi";

// The validator's verdict on a document: exit 0 = valid.
CommandOutput validate(const TempDir& dir, const nlohmann::json& doc, const std::string& name) {
  const std::string path = dir.file(name);
  std::ofstream(path) << doc.dump(2);
  return run_command("node " + kValidator + "/validate.mjs " + path + " 2>&1");
}

void require_validator_or_skip() {
  require_tool_or_skip("node", "nodejs");
  if (std::filesystem::exists(kValidator + "/node_modules/@seriousme/openapi-schema-validator")) return;
  const std::string message = "SKIPPED: " + kValidator + "/node_modules is missing (run scripts/setup.sh)";
  WARN(message);
  std::fprintf(stderr, "%s\n", message.c_str());
  std::exit(4);
}

}  // namespace

TEST_CASE("GET /v1/openapi.json is valid OpenAPI 3.1 and describes every route and edit parameter", "[server][openapi]") {
  require_validator_or_skip();
  ServerFixture f;
  Response r = request(f.unix_ep, "GET", "/v1/openapi.json");
  REQUIRE(r.status == 200);
  const nlohmann::json doc = r.json();
  const CommandOutput check = validate(f.dir, doc, "openapi.json");
  INFO(check.output);
  REQUIRE(check.exit_code == 0);
  CHECK(nlohmann::json::parse(check.output)["version"] == "3.1");

  // Every operation of the route table, and nothing else.
  size_t operations = 0;
  for (const auto& [path, item] : doc["paths"].items()) operations += item.size();
  CHECK(operations == kApiOperations.size());
  for (const ApiOperation& op : kApiOperations) {
    std::string method(op.method);
    for (char& c : method) c = static_cast<char>(std::tolower(c));
    INFO(op.method << " " << op.path);
    CHECK(doc["paths"][std::string(op.path)].contains(method));
  }
  // The edit body's schema is the parameter table's.
  const nlohmann::json& props = doc["components"]["schemas"]["EditParameters"]["properties"];
  for (const protocol::EditParameter& p : protocol::kEditParameters) {
    INFO(std::string(p.name));
    CHECK(props.contains(std::string(p.name)) == bool(p.clients & protocol::kApi));
  }
  CHECK(props["halo_tokens"]["maximum"] == protocol::edit_parameter("halo_tokens").max);
  CHECK(props["strength"]["exclusiveMinimum"] == 0);

  // The validator is not a rubber stamp: a dangling $ref and a missing response both fail.
  nlohmann::json broken = doc;
  broken["paths"]["/v1/edits"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"] =
      "#/components/schemas/Nope";
  CHECK(validate(f.dir, broken, "broken-ref.json").exit_code != 0);
  broken = doc;
  broken["paths"]["/v1/models"]["get"].erase("responses");
  broken["paths"]["/v1/models"]["get"]["responses"] = 7;
  CHECK(validate(f.dir, broken, "broken-responses.json").exit_code != 0);
}

TEST_CASE("the dispatcher routes exactly the route table: listed methods answer, others are 405 naming them",
          "[server][openapi]") {
  ServerFixture f;
  const std::string tmpl = f.upload();
  auto concrete = [&](std::string_view path) {
    std::string p(path);
    const size_t at = p.find("{id}");
    if (at != std::string::npos) p.replace(at, 4, p.rfind("/v1/templates", 0) == 0 ? tmpl : "999");
    return p;
  };
  for (const ApiOperation& op : kApiOperations) {
    if (op.path == "/v1/events") continue;  // a stream: checked by the events tests
    INFO(op.method << " " << op.path);
    Response r = request(f.unix_ep, std::string(op.method), concrete(op.path), "", {"Content-Type: application/json"});
    INFO(r.body);
    CHECK(r.body.find("no_such_route") == std::string::npos);  // a 404 for the unknown id 999 is fine
    CHECK(r.status != 405);
    CHECK(r.status != 500);
  }
  for (const char* method : {"GET", "POST", "PUT", "DELETE", "PATCH"}) {
    for (const ApiOperation& op : kApiOperations) {
      const std::string allowed = api_methods_of(op.path);
      bool listed = false;
      for (const ApiOperation& other : kApiOperations) listed = listed || (other.path == op.path && other.method == method);
      if (listed) continue;
      INFO(method << " " << op.path);
      Response r = request(f.unix_ep, method, concrete(op.path));
      CHECK(r.status == 405);
      CHECK(r.body.find("(allowed: " + allowed + ")") != std::string::npos);
    }
  }
  Response nowhere = request(f.unix_ep, "GET", "/v2/everything");
  CHECK(nowhere.status == 404);
  CHECK(nowhere.body.find(api_route_list()) != std::string::npos);
}
