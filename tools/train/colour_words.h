#pragma once
/// The prompt vocabulary of infill-tiny and how a region's colour is named with it: training
/// labels come from here, and the quality benchmark judges prompt adherence with the same
/// reference colours, so the two can never disagree.

#include <array>
#include <string>
#include <vector>

namespace infill::train {

/// Colour words first (kColourWords of them), then the tone words.
inline const std::vector<std::string>& vocabulary() {
  static const std::vector<std::string> words = {"red",  "orange", "yellow", "green", "cyan",  "blue",  "purple",
                                                 "pink", "brown",  "white",  "gray",  "black", "bright", "dark"};
  return words;
}
inline constexpr int kColourWords = 12;
inline constexpr int kBrightWord = 12;
inline constexpr int kDarkWord = 13;

using Rgb = std::array<double, 3>;  ///< sRGB in [0, 1]
using Lab = std::array<double, 3>;  ///< CIELAB (D65)

/// Reference sRGB colour of colour word `index` (< kColourWords).
Rgb reference_colour(int index);
Lab srgb_to_lab(const Rgb& rgb);
/// Colour word whose reference colour is nearest to `mean` (CIE76 distance in Lab).
int nearest_colour_word(const Rgb& mean);
/// Words describing a region of mean colour `mean`: its nearest colour word, plus "bright"
/// or "dark" when its lightness is more than kToneMargin L* above or below that reference's.
std::vector<int> describe_colour(const Rgb& mean);
inline constexpr double kToneMargin = 15.0;

}  // namespace infill::train
