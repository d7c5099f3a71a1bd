// Captions of colour labels: the label words stay the truth, training and held-out phrasings
// never meet, and the caller's random value alone picks the caption.

#include "support/catch.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

#include "tools/train/captions.h"
#include "tools/train/colour_words.h"

using namespace infill::train;

namespace {

// The vocabulary words a caption names, synonyms mapped back ("grey" -> gray, "light" ->
// bright), as vocabulary indices, sorted.
std::vector<int> named_words(const std::string& caption) {
  std::vector<int> out;
  std::string word;
  const auto flush = [&] {
    if (word == "grey") word = "gray";
    if (word == "light") word = "bright";
    const auto& v = vocabulary();
    if (const auto it = std::find(v.begin(), v.end(), word); it != v.end())
      out.push_back(static_cast<int>(it - v.begin()));
    word.clear();
  };
  for (const char c : caption) {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      flush();
    }
  }
  flush();
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("captions name exactly their label's words, in both splits", "[train][captions]") {
  for (const auto split : {CaptionSplit::kTraining, CaptionSplit::kHeldOut}) {
    for (const std::vector<int>& label : every_label()) {
      const std::vector<std::string> captions = every_caption(label, split);
      CHECK(captions.size() >= caption_frames(split).size());
      for (const std::string& caption : captions) {
        INFO(caption);
        CHECK(named_words(caption) == label);  // label: colour index, then the larger tone index
      }
    }
  }
}

TEST_CASE("training and held-out phrasings are disjoint, held-out word orders unseen",
          "[train][captions]") {
  const auto& training = caption_frames(CaptionSplit::kTraining);
  const auto& held_out = caption_frames(CaptionSplit::kHeldOut);
  CHECK(training.size() >= 20);
  CHECK(held_out.size() >= 8);
  for (const std::string& frame : held_out) {
    INFO(frame);
    CHECK(std::find(training.begin(), training.end(), frame) == training.end());
  }
  std::set<std::string> seen;
  for (const std::vector<int>& label : every_label()) {
    for (const std::string& caption : every_caption(label, CaptionSplit::kTraining)) {
      seen.insert(caption);
      // The held-out orders ("dark-blue", "blue but dark") never appear in training.
      CHECK(caption.find('-') == std::string::npos);
      CHECK(caption.find(" but ") == std::string::npos);
      CHECK(caption.find(" BUT ") == std::string::npos);
    }
  }
  for (const std::vector<int>& label : every_label()) {
    for (const std::string& caption : every_caption(label, CaptionSplit::kHeldOut)) {
      INFO(caption);
      CHECK(seen.count(caption) == 0);
    }
  }
  CHECK(training_caption_corpus().size() == seen.size());  // distinct across labels too
}

TEST_CASE("make_caption is a function of its random value and gives every_caption's captions",
          "[train][captions]") {
  const std::vector<int> dark_blue = {5, kDarkWord};
  const std::vector<std::string> all = every_caption(dark_blue, CaptionSplit::kTraining);
  std::set<std::string> drawn;
  for (uint64_t r = 0; r < 4000; ++r) {
    const std::string caption = make_caption(dark_blue, CaptionSplit::kTraining, r);
    CHECK(caption == make_caption(dark_blue, CaptionSplit::kTraining, r));
    CHECK(std::binary_search(all.begin(), all.end(), caption));
    drawn.insert(caption);
  }
  // 23 frames x 2 orders x 3 cases = 138 captions; 4000 draws reach nearly all.
  CHECK(drawn.size() * 10 >= all.size() * 9);
  const std::set<std::string> some = {"make it dark blue", "a dark blue patch",
                                      "dark blue",         "blue, dark",
                                      "Dark blue",         "DARK BLUE, PLEASE"};
  for (const std::string& caption : some) {
    INFO(caption);
    CHECK(std::binary_search(all.begin(), all.end(), caption));
  }
  const auto orange = every_caption({1}, CaptionSplit::kTraining);
  CHECK(std::binary_search(orange.begin(), orange.end(), "an orange patch"));
  CHECK(std::binary_search(orange.begin(), orange.end(), "An orange area"));
  const auto light_grey = every_caption({10, kBrightWord}, CaptionSplit::kHeldOut);
  CHECK(std::binary_search(light_grey.begin(), light_grey.end(), "COULD YOU MAKE IT LIGHT-GREY?"));
  CHECK(std::binary_search(light_grey.begin(), light_grey.end(), "give it a gray but bright look"));
}

TEST_CASE("in_capitals upper-cases letters only, and make_caption's capitals are its captions in capitals",
          "[train][captions]") {
  CHECK(in_capitals("could you make it light-grey? ok") == "COULD YOU MAKE IT LIGHT-GREY? OK");
  CHECK(in_capitals("An orange patch, 2x!") == "AN ORANGE PATCH, 2X!");
  CHECK(in_capitals("") == "");
  const std::string accented = "caf\xc3\xa9 blue";  // UTF-8 bytes above 127 stay as they are
  CHECK(in_capitals(accented) == "CAF\xc3\xa9 BLUE");
  // Every caption of a label in capitals is one of the label's captions (the capitals stage of
  // the recipe shows no phrasing training does not), and names the same words.
  for (const std::vector<int>& label : every_label()) {
    const std::vector<std::string> all = every_caption(label, CaptionSplit::kTraining);
    for (const std::string& caption : all) {
      INFO(caption);
      CHECK(std::binary_search(all.begin(), all.end(), in_capitals(caption)));
      CHECK(named_words(in_capitals(caption)) == label);
    }
  }
}

TEST_CASE("a malformed label is a programming error", "[train][captions]") {
  CHECK_THROWS_AS(make_caption({}, CaptionSplit::kTraining, 0), std::invalid_argument);
  CHECK_THROWS_AS(make_caption({kColourWords}, CaptionSplit::kTraining, 0), std::invalid_argument);
  CHECK_THROWS_AS(make_caption({2, 3}, CaptionSplit::kTraining, 0), std::invalid_argument);
  CHECK_THROWS_AS(every_caption({2, kDarkWord, kDarkWord}, CaptionSplit::kHeldOut),
                  std::invalid_argument);
}

TEST_CASE("distractors add one to four words that name no colour, keep the caption's words in order, and depend on the draw alone",
          "[train][captions]") {
  auto words_of = [](const std::string& text) {
    std::vector<std::string> out;
    std::string w;
    for (const char c : text + " ") {
      if (c == ' ') {
        if (!w.empty()) out.push_back(w);
        w.clear();
      } else {
        w += c;
      }
    }
    return out;
  };
  std::set<std::string> made;
  int with_punctuation = 0;
  for (uint64_t draw = 0; draw < 2000; ++draw) {
    const std::vector<int> label = every_label()[draw % every_label().size()];
    const std::string caption = make_caption(label, CaptionSplit::kTraining, draw * 7919);
    const std::string noisy = add_distractors(caption, draw);
    INFO(caption << " -> " << noisy);
    CHECK(add_distractors(caption, draw) == noisy);
    CHECK(named_words(noisy) == label);  // still exactly the label's colour and tone words
    const std::vector<std::string> before = words_of(caption), after = words_of(noisy);
    REQUIRE(after.size() >= before.size() + 1);
    CHECK(after.size() <= before.size() + 4);
    // The caption's own words are a subsequence of the noisy one's.
    size_t next = 0;
    for (const std::string& w : after)
      if (next < before.size() && w == before[next]) ++next;
    CHECK(next == before.size());
    for (const std::string& w : after) {
      if (std::find(before.begin(), before.end(), w) != before.end()) continue;
      std::string lower;
      for (const char c : w) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      for (const std::string& colour : vocabulary()) CHECK(lower.find(colour) == std::string::npos);
      CHECK(lower.find("grey") == std::string::npos);
      CHECK(lower.find("light") == std::string::npos);
      with_punctuation += std::ispunct(static_cast<unsigned char>(w.back())) ? 1 : 0;
      made.insert(w);
    }
  }
  CHECK(made.size() > 500);       // varied: not a handful of fixed words
  CHECK(with_punctuation > 100);  // and punctuation is among them
}
