#pragma once
/// The --items selection: "A-B" (inclusive), "A" (one item), "A-" (to the end). Items are
/// numbered from 1, like the frame ranges of OpenCue, Deadline and Flamenco.

#include <string>

#include "common/status.h"

namespace infill::render {

struct ItemRange {
  int first = 1;
  int last = 0;  ///< inclusive
  int count() const { return last >= first ? last - first + 1 : 0; }
};

/// Parses `text` against a job of `item_count` items. Errors (invalid_argument) say what was
/// given and what was expected: "--items 5-3: first item 5 is after last item 3",
/// "--items 1-40: the job has 20 items; expected a range within 1-20".
Result<ItemRange> parse_item_range(const std::string& text, int item_count);

}  // namespace infill::render
