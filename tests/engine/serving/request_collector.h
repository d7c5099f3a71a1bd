#pragma once
// Gathers every on_complete call of the serving runtime's requests, by id (the serving tests').
#include "support/catch.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "serving/serving_request.h"

namespace infill::test {

struct RequestCollector {
  std::mutex mu;
  std::map<uint64_t, std::vector<RequestResult>> results;
  std::atomic<int> progress_calls{0};
  std::atomic<int> preview_calls{0};

  std::function<void(const RequestResult&)> callback() {
    return [this](const RequestResult& r) {
      std::lock_guard lock(mu);
      results[r.id].push_back(r);
    };
  }
  /// The one result of `id` (a copy: the map may grow while the caller reads it).
  RequestResult only(uint64_t id) {
    std::lock_guard lock(mu);
    REQUIRE(results.count(id) == 1);
    REQUIRE(results[id].size() == 1);
    return results[id].front();
  }
};

}  // namespace infill::test
