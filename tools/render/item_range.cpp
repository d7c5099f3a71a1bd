#include "item_range.h"


namespace infill::render {
namespace {

bool parse_number(const std::string& s, int& out) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  out = std::stoi(s);
  return true;
}

}  // namespace

Result<ItemRange> parse_item_range(const std::string& text, int item_count) {
  const std::string all = item_count > 0 ? "1-" + std::to_string(item_count) : "none";
  const std::string what = "--items " + text + ": ";
  const std::string expected = "; expected A-B, A or A- with 1 <= A <= B <= " + std::to_string(item_count) +
                               " (the job has " + std::to_string(item_count) + " items: " + all + ")";
  ItemRange r;
  const size_t dash = text.find('-');
  const std::string a = text.substr(0, dash);
  if (!parse_number(a, r.first)) return invalid_argument(what + "'" + a + "' is not an item number" + expected);
  if (dash == std::string::npos) {
    r.last = r.first;
  } else if (dash + 1 == text.size()) {
    r.last = item_count;
  } else if (!parse_number(text.substr(dash + 1), r.last)) {
    return invalid_argument(what + "'" + text.substr(dash + 1) + "' is not an item number" + expected);
  }
  if (r.first < 1) return invalid_argument(what + "items are numbered from 1" + expected);
  if (r.first > r.last)
    return invalid_argument(what + "first item " + std::to_string(r.first) + " is after last item " +
                            std::to_string(r.last) + expected);
  if (r.last > item_count)
    return invalid_argument(what + "item " + std::to_string(r.last) + " does not exist" + expected);
  return r;
}

}  // namespace infill::render
