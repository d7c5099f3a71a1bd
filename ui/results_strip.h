#pragma once
/// @file
/// The history strip of finished variations.

#include <QListWidget>
#include <vector>

#include "ui/edit_controller.h"

namespace infill::ui {

/// Thumbnails of results, newest last. Selecting one emits resultSelected(); double-click
/// (or Enter) emits applyRequested(). Keeps the last kMaxResults results.
class ResultsStrip : public QListWidget {
  Q_OBJECT

 public:
  static constexpr int kMaxResults = 64;

  explicit ResultsStrip(QWidget* parent = nullptr);

  void addResult(const GenerationResult& result);
  int resultCount() const { return static_cast<int>(results_.size()); }
  /// The selected result, or nullptr.
  const GenerationResult* selectedResult() const;
  const GenerationResult& result(int index) const { return results_.at(static_cast<size_t>(index)); }
  void clearResults();

 signals:
  void resultSelected(int index);
  void applyRequested(int index);

 private:
  std::vector<GenerationResult> results_;
};

}  // namespace infill::ui
