#pragma once
/// Free-text prompts for the bundled model's training labels: a region's colour label (the
/// word indices describe_colour returns: one colour word, then "bright" or "dark" or nothing)
/// becomes a varied caption ("make it dark blue", "a dark blue patch", "blue, dark", ...).
///
/// The label words are the model's truth, so every caption of a label names exactly its words
/// and no other colour or tone: the only substitutes are synonyms with the same meaning in
/// this vocabulary ("grey" for "gray"; "light" for "bright", which describe_colour means as
/// "lighter than the reference colour"). Captions come from sentence frames in two disjoint
/// sets: the training frames, which training draws from and the tokenizer corpus enumerates,
/// and the held-out frames (other sentences, plus word orders training never shows), which
/// only measure generalisation. The null prompt of classifier-free guidance is "", never a
/// caption. Pure functions; thread-safe.

#include <cstdint>
#include <string>
#include <vector>

namespace infill::train {

enum class CaptionSplit {
  kTraining = 1,  ///< frames and word orders training uses
  kHeldOut = 2,   ///< frames and word orders kept out of training
};

/// Sentence frames of `split`; "{}" stands for the colour phrase ("dark blue"). The articles
/// "a" and "A" become "an" and "An" before a vowel ("an orange patch"). For the model card.
const std::vector<std::string>& caption_frames(CaptionSplit split);

/// Colour-phrase word orders of `split` for a toned label; "{c}" is the colour, "{t}" the
/// tone ("{t} {c}" gives "dark blue"). Untoned labels use the colour word alone.
const std::vector<std::string>& caption_word_orders(CaptionSplit split);

/// A caption of `label` (a colour word index < kColourWords, then optionally kBrightWord or
/// kDarkWord, as describe_colour returns) from `split`, chosen by `random` (a value the caller
/// draws from its own seeded generator; the same inputs give the same caption). It picks the
/// frame, the word order, synonyms and the letter case (mostly lower case, sometimes
/// sentence case, rarely upper case). Throws std::invalid_argument for a malformed label (a
/// programming error).
std::string make_caption(const std::vector<int>& label, CaptionSplit split, uint64_t random);

/// `caption` with one to four distractor words inserted at word boundaries, chosen by
/// `random`: words of the training frames ("make", "patch", ...), made-up lower-case words of
/// two to eight letters, and punctuation (? ! . ' -) glued to a word. The transformer trained
/// on captions built only from a couple of dozen frames leaned on their exact words: unseen
/// words pulled its edits towards grey. Distractors teach it that only the colour and tone
/// words carry the colour. A distractor never contains a colour or tone word or a synonym
/// ("tan" could be drawn; "reddish" could not), and the held-out frames' words are never
/// drawn as such (they may still arise by chance as made-up words, like any other string).
std::string add_distractors(const std::string& caption, uint64_t random);

/// `caption` in capitals ("MAKE IT DARK BLUE"): ASCII letters upper-cased, other bytes as
/// they are. make_caption gives capitals rarely; the recipe's capitals stage uses this to show
/// them often (the byte-level BPE reads "PURPLE" as other tokens than "purple").
std::string in_capitals(const std::string& caption);

/// Every distinct caption make_caption can give for `label` and `split`, sorted (the
/// tokenizer corpus uses the training ones of every label).
std::vector<std::string> every_caption(const std::vector<int>& label, CaptionSplit split);

/// Every label describe_colour can return: each colour word alone, with "bright", with "dark".
std::vector<std::vector<int>> every_label();

/// The training captions of every label (every_caption(label, kTraining) in every_label()
/// order): the caption part of the tokenizer corpus.
std::vector<std::string> training_caption_corpus();

}  // namespace infill::train
