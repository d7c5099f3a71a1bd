// infill-model-check FILE...: runs the call recorded in each reference tensor file and prints
// one JSON line per file; exit 0 only when every file loads and matches (model/reference_check.h).
#include <cstdio>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "model/reference_check.h"

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: infill-model-check [--blocks] FILE...\n"
               "Runs the call recorded in each reference file (weights.*, input.*, output.*, trace.*)\n"
               "and prints one JSON line per file: {\"file\", \"model\", \"max_abs_err\", \"max_rel_err\", \"ok\"}.\n"
               "ok: max |diff| / max |reference| <= %g. --blocks adds every compared tensor.\n"
               "Exit code 0 only when every file is ok.\n",
               infill::kReferenceTolerance);
}

}  // namespace

int main(int argc, char** argv) {
  bool blocks = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (std::strcmp(argv[i], "--blocks") == 0) {
      blocks = true;
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "infill-model-check: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    } else {
      files.emplace_back(argv[i]);
    }
  }
  if (files.empty()) {
    usage(stderr);
    return 2;
  }
  bool all_ok = true;
  for (const std::string& file : files) {
    nlohmann::ordered_json line;
    line["file"] = file;
    auto check = infill::run_reference_check(file);
    if (!check.ok()) {
      line["model"] = nullptr;
      line["error"] = check.status().to_string();
      line["ok"] = false;
      all_ok = false;
    } else {
      line["model"] = check->model;
      line["max_abs_err"] = check->max_abs_err;
      line["max_rel_err"] = check->max_rel_err;
      line["ok"] = check->ok;
      all_ok = all_ok && check->ok;
      if (blocks) {
        nlohmann::ordered_json list = nlohmann::ordered_json::array();
        for (const auto& c : check->comparisons) {
          list.push_back({{"name", c.name}, {"max_abs_err", c.max_abs_err}, {"max_rel_err", c.max_rel_err}});
        }
        line["comparisons"] = std::move(list);
      }
    }
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  return all_ok ? 0 : 1;
}
