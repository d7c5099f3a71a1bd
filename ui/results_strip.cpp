#include "ui/results_strip.h"

#include <QPixmap>

namespace infill::ui {

ResultsStrip::ResultsStrip(QWidget* parent) : QListWidget(parent) {
  setViewMode(QListView::IconMode);
  setFlow(QListView::LeftToRight);
  setWrapping(false);
  setMovement(QListView::Static);
  setIconSize(QSize(112, 112));
  setSpacing(4);
  setSelectionMode(QAbstractItemView::SingleSelection);
  setFixedHeight(160);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAsNeeded);
  setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  connect(this, &QListWidget::currentRowChanged, this, [this](int row) {
    if (row >= 0) emit resultSelected(row);
  });
  connect(this, &QListWidget::itemActivated, this, [this](QListWidgetItem* item) { emit applyRequested(row(item)); });
}

void ResultsStrip::addResult(const GenerationResult& result) {
  if (results_.size() >= static_cast<size_t>(kMaxResults)) {
    results_.erase(results_.begin());
    delete takeItem(0);
  }
  results_.push_back(result);
  const QImage thumb = result.image.scaled(iconSize(), Qt::KeepAspectRatio, Qt::SmoothTransformation);
  auto* item = new QListWidgetItem(QIcon(QPixmap::fromImage(thumb)),
                                   result.live ? tr("live %1 ms").arg(qRound(result.latency_ms))
                                               : tr("seed %1").arg(result.seed));
  item->setToolTip(tr("prompt \"%1\", seed %2, %3 ms (engine %4 ms)")
                       .arg(result.prompt).arg(result.seed).arg(qRound(result.latency_ms)).arg(qRound(result.engine_ms)));
  addItem(item);
  scrollToItem(item);
}

const GenerationResult* ResultsStrip::selectedResult() const {
  const int row = currentRow();
  return row >= 0 && row < resultCount() ? &results_[static_cast<size_t>(row)] : nullptr;
}

void ResultsStrip::clearResults() {
  results_.clear();
  clear();
}

}  // namespace infill::ui
