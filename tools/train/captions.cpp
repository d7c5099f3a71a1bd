#include "captions.h"

#include <cctype>
#include <set>
#include <stdexcept>
#include <string_view>

#include "colour_words.h"

namespace infill::train {

namespace {

// Letter case of a caption: as the frame writes it (mostly lower case), the first letter
// capitalised, or all capitals.
enum class LetterCase { kAsWritten, kSentence, kUpper };
constexpr LetterCase kCases[] = {LetterCase::kAsWritten, LetterCase::kSentence, LetterCase::kUpper};

// The choices behind one caption; make_caption draws them, every_caption enumerates them.
struct Choice {
  size_t frame = 0;
  size_t order = 0;    // into word_orders(split)
  bool grey = false;   // "grey" instead of "gray"
  bool light = false;  // "light" instead of "bright"
  LetterCase letter_case = LetterCase::kAsWritten;
};

// The word orders a split draws from: held-out captions use the training orders too.
std::vector<std::string> word_orders(CaptionSplit split) {
  std::vector<std::string> out = caption_word_orders(CaptionSplit::kTraining);
  if (split == CaptionSplit::kHeldOut) {
    for (const std::string& o : caption_word_orders(CaptionSplit::kHeldOut)) out.push_back(o);
  }
  return out;
}

void check_label(const std::vector<int>& label) {
  const bool ok = (label.size() == 1 || label.size() == 2) && label[0] >= 0 &&
                  label[0] < kColourWords &&
                  (label.size() == 1 || label[1] == kBrightWord || label[1] == kDarkWord);
  if (!ok) {
    std::string text;
    for (const int w : label) text += (text.empty() ? "" : ", ") + std::to_string(w);
    throw std::invalid_argument(
        "caption label {" + text +
        "} is not a colour word index optionally followed by kBrightWord or kDarkWord");
  }
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// "a orange" -> "an orange" (and "A orange" -> "An orange"): the article is a word of its own.
std::string fix_articles(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    const bool article = (text[i] == 'a' || text[i] == 'A') && (i == 0 || text[i - 1] == ' ') &&
                         i + 2 < text.size() && text[i + 1] == ' ';
    if (article && std::string_view("aeiouAEIOU").find(text[i + 2]) != std::string_view::npos) {
      out += 'n';
    }
  }
  return out;
}

std::string compose(const std::vector<int>& label, CaptionSplit split, const Choice& c) {
  std::string colour = vocabulary()[static_cast<size_t>(label[0])];
  if (colour == "gray" && c.grey) colour = "grey";
  std::string phrase = colour;
  if (label.size() == 2) {
    const std::string tone = label[1] == kBrightWord ? (c.light ? "light" : "bright") : "dark";
    phrase = replace_all(replace_all(word_orders(split)[c.order], "{c}", colour), "{t}", tone);
  }
  std::string text = fix_articles(replace_all(caption_frames(split)[c.frame], "{}", phrase));
  switch (c.letter_case) {
    case LetterCase::kAsWritten:
      break;
    case LetterCase::kSentence:
      text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
      break;
    case LetterCase::kUpper:
      text = in_capitals(text);
      break;
  }
  return text;
}

// SplitMix64: successive well-mixed draws from one caller-supplied value.
struct Draws {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

}  // namespace

const std::vector<std::string>& caption_frames(CaptionSplit split) {
  static const std::vector<std::string> training = {
      "{}",
      "{}, please",
      "make it {}",
      "make this {}",
      "make the selection {}",
      "paint this {}",
      "paint it {}",
      "turn the region {}",
      "turn it {}",
      "colour it {}",
      "color this area {}",
      "recolour this {}",
      "change the colour to {}",
      "fill with {}",
      "fill the mask with {}",
      "a {} patch",
      "a {} area",
      "a patch of {}",
      "{} colour",
      "{} color",
      "{} paint",
      "use {}",
      "I want it {}",
  };
  static const std::vector<std::string> held_out = {
      "could you make it {}?",
      "I'd like this to be {}",
      "the hole should be {}",
      "set the area to {}.",
      "{} here",
      "give it a {} look",
      "fill in {} everywhere",
      "just {}!",
  };
  return split == CaptionSplit::kHeldOut ? held_out : training;
}

const std::vector<std::string>& caption_word_orders(CaptionSplit split) {
  static const std::vector<std::string> training = {"{t} {c}", "{c}, {t}"};
  static const std::vector<std::string> held_out = {"{t}-{c}", "{c} but {t}"};
  return split == CaptionSplit::kHeldOut ? held_out : training;
}

std::string make_caption(const std::vector<int>& label, CaptionSplit split, uint64_t random) {
  check_label(label);
  Draws draws{random};
  Choice c;
  c.frame = draws.below(caption_frames(split).size());
  c.order = draws.below(word_orders(split).size());
  c.grey = draws.below(2) == 1;
  c.light = draws.below(2) == 1;
  const size_t case_draw = draws.below(10);  // 70 % as written, 20 % sentence case, 10 % capitals
  c.letter_case = case_draw < 7   ? LetterCase::kAsWritten
                  : case_draw < 9 ? LetterCase::kSentence
                                  : LetterCase::kUpper;
  return compose(label, split, c);
}

namespace {

// The words of the training frames, once each, in order of first appearance.
const std::vector<std::string>& training_frame_words() {
  static const std::vector<std::string> words = [] {
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const std::string& frame : caption_frames(CaptionSplit::kTraining)) {
      std::string word;
      for (const char ch : frame + " ") {
        if (std::isalpha(static_cast<unsigned char>(ch))) {
          word += ch;
        } else {
          if (!word.empty() && seen.insert(word).second) out.push_back(word);
          word.clear();
        }
      }
    }
    return out;
  }();
  return words;
}

// True when `word` contains a colour or tone word or one of their synonyms.
bool names_a_colour(const std::string& word) {
  std::string lower;
  for (const char ch : word) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const std::string& w : vocabulary())
    if (lower.find(w) != std::string::npos) return true;
  for (const char* synonym : {"grey", "light"})
    if (lower.find(synonym) != std::string::npos) return true;
  return false;
}

std::string distractor_word(Draws& draws) {
  for (;;) {
    std::string word;
    if (draws.below(2) == 0) {
      word = training_frame_words()[draws.below(training_frame_words().size())];
    } else {
      const size_t letters = 2 + draws.below(7);
      for (size_t i = 0; i < letters; ++i) word += static_cast<char>('a' + draws.below(26));
    }
    if (names_a_colour(word)) continue;
    static constexpr std::string_view kPunctuation = "?!.'-";
    if (draws.below(4) == 0) word += kPunctuation[draws.below(kPunctuation.size())];
    return word;
  }
}

}  // namespace

std::string in_capitals(const std::string& caption) {
  std::string out = caption;
  for (char& ch : out) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return out;
}

std::string add_distractors(const std::string& caption, uint64_t random) {
  Draws draws{random};
  std::vector<std::string> words;
  std::string word;
  for (const char ch : caption + " ") {
    if (ch == ' ') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += ch;
    }
  }
  const size_t extra = 1 + draws.below(4);
  for (size_t i = 0; i < extra; ++i) {
    const size_t at = draws.below(words.size() + 1);
    words.insert(words.begin() + static_cast<std::ptrdiff_t>(at), distractor_word(draws));
  }
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

std::vector<std::string> every_caption(const std::vector<int>& label, CaptionSplit split) {
  check_label(label);
  std::set<std::string> out;
  Choice c;
  for (c.frame = 0; c.frame < caption_frames(split).size(); ++c.frame) {
    for (c.order = 0; c.order < word_orders(split).size(); ++c.order) {
      for (const bool grey : {false, true}) {
        for (const bool light : {false, true}) {
          for (const LetterCase letter_case : kCases) {
            c.grey = grey;
            c.light = light;
            c.letter_case = letter_case;
            out.insert(compose(label, split, c));
          }
        }
      }
    }
  }
  return {out.begin(), out.end()};
}

std::vector<std::vector<int>> every_label() {
  std::vector<std::vector<int>> out;
  for (int colour = 0; colour < kColourWords; ++colour) {
    out.push_back({colour});
    out.push_back({colour, kBrightWord});
    out.push_back({colour, kDarkWord});
  }
  return out;
}

std::vector<std::string> training_caption_corpus() {
  std::vector<std::string> out;
  for (const std::vector<int>& label : every_label()) {
    for (std::string& caption : every_caption(label, CaptionSplit::kTraining))
      out.push_back(std::move(caption));
  }
  return out;
}

}  // namespace infill::train
