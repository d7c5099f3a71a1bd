// The device list of --device and the config's `device`: syntax, labels of several CPU
// devices, "cuda" as every visible GPU, and errors naming the entry.
#include "support/catch.h"

#include "serving/device_list.h"

using namespace infill;

TEST_CASE("a device list names each device, CPU devices by their position", "[serving][devices]") {
  auto one = resolve_device_list("cpu");
  REQUIRE(one.ok());
  REQUIRE(one->size() == 1);
  CHECK(one->front().label == "cpu");
  CHECK_FALSE(one->front().device.cuda);
  auto two = resolve_device_list(" cpu , cpu ");
  REQUIRE(two.ok());
  REQUIRE(two->size() == 2);
  CHECK((*two)[0].label == "cpu:0");
  CHECK((*two)[1].label == "cpu:1");
  CHECK(count_devices("cpu,cpu,cpu", 0) == 3);
  CHECK(count_devices("cuda,cpu", 4) == 5);
  CHECK(count_devices("cuda:0,cuda:1", 0) == 2);
  CHECK(count_devices("cpu,,cpu", 4) == 0);
}

TEST_CASE("a device list with a bad entry is an error naming it", "[serving][devices]") {
  CHECK(check_device_list("cuda:0,cuda:1").ok());  // syntax only: no look at this machine
  CHECK(check_device_list("cuda").ok());
  const Status empty = check_device_list("cpu,,cpu");
  CHECK(empty.message().find("has an empty entry") != std::string::npos);
  CHECK_FALSE(check_device_list("").ok());
  const Status bad = check_device_list("cpu,gpu");
  CHECK(bad.message().find("device \"gpu\": expected cpu, cuda or cuda:N") != std::string::npos);
  if (cuda_device_count() == 0) {
    // Every visible GPU where none is: named as such; a missing GPU by its name.
    auto all = resolve_device_list("cuda");
    REQUIRE_FALSE(all.ok());
    CHECK(all.status().message().find("cuda (every visible GPU): none is visible") !=
          std::string::npos);
    auto missing = resolve_device_list("cpu,cuda:1");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.status().message().find("cuda:1") != std::string::npos);
  } else {
    auto all = resolve_device_list("cuda");
    REQUIRE(all.ok());
    CHECK(static_cast<int>(all->size()) == cuda_device_count());
    CHECK(all->front().label == "cuda:0");
    auto twice = resolve_device_list("cuda:0,cuda:0");
    REQUIRE_FALSE(twice.ok());
    CHECK(twice.status().message().find("names cuda:0 twice") != std::string::npos);
  }
}
