#include <infill_protocol/edit_parameters.h>

#include "ui/parameters_panel.h"

#include <QAbstractItemView>
#include <QCheckBox>
#include <QComboBox>
#include <QCompleter>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QRegularExpression>
#include <QSpinBox>
#include <QStringListModel>

#include <limits>

#include "ui/adapter_list.h"
#include "ui/reference_strip.h"

namespace infill::ui {

namespace {

// The widget's range from the one parameter table (protocol/infill_protocol/edit_parameters.h),
// so the editor offers exactly what the engine accepts.
void setRangeFromTable(QSpinBox* box, std::string_view name) {
  const infill::protocol::EditParameter& p = infill::protocol::edit_parameter(name);
  box->setRange(static_cast<int>(infill::protocol::editor_min(p)), static_cast<int>(infill::protocol::editor_max(p)));
}
void setRangeFromTable(QDoubleSpinBox* box, std::string_view name) {
  const infill::protocol::EditParameter& p = infill::protocol::edit_parameter(name);
  box->setRange(infill::protocol::editor_min(p), infill::protocol::editor_max(p));
}

QStringList prompt_words(const QString& prompt) {
  // The engine's rule (engine/model/prompt_encoder.cpp): split on white space and commas,
  // compare lower-cased.
  static const QRegularExpression separators(QStringLiteral("[\\s,]+"));
  QStringList words = prompt.toLower().split(separators, Qt::SkipEmptyParts);
  return words;
}

// Start of the word the cursor is in (after the last space or comma before it).
int word_start(const QString& text, int cursor) {
  int i = cursor;
  while (i > 0 && !text[i - 1].isSpace() && text[i - 1] != QLatin1Char(',')) --i;
  return i;
}

}  // namespace

QStringList invalid_prompt_words(const QString& prompt, const QStringList& vocabulary) {
  QStringList bad;
  for (const QString& w : prompt_words(prompt)) {
    if (!vocabulary.contains(w) && !bad.contains(w)) bad << w;
  }
  return bad;
}

ParametersPanel::ParametersPanel(QWidget* parent) : QWidget(parent) {
  auto* form = new QFormLayout(this);
  form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);

  model_ = new QComboBox(this);
  model_label_ = new QLabel(tr("Model"), this);
  form->addRow(model_label_, model_);
  model_->setVisible(false);
  model_label_->setVisible(false);

  prompt_ = new QLineEdit(this);
  prompt_->setObjectName(QStringLiteral("prompt"));
  prompt_->setPlaceholderText(tr("e.g. green dark"));
  prompt_->setClearButtonEnabled(true);
  form->addRow(tr("Prompt"), prompt_);
  prompt_error_ = new QLabel(this);
  prompt_error_->setWordWrap(true);
  prompt_error_->setStyleSheet(QStringLiteral("color: #e04050;"));
  prompt_error_->setVisible(false);
  form->addRow(QString(), prompt_error_);

  // The completer works on the word under the cursor, not the whole line.
  words_model_ = new QStringListModel(this);
  completer_ = new QCompleter(words_model_, this);
  completer_->setCaseSensitivity(Qt::CaseInsensitive);
  completer_->setCompletionMode(QCompleter::PopupCompletion);
  completer_->setWidget(prompt_);
  connect(completer_, qOverload<const QString&>(&QCompleter::activated), this, &ParametersPanel::completeWord);
  connect(prompt_, &QLineEdit::textEdited, this, [this] { updateCompletionPrefix(); });
  connect(prompt_, &QLineEdit::textChanged, this, [this] {
    validatePrompt();
    emit paramsChanged();
  });

  auto* seed_row = new QHBoxLayout;
  seed_ = new QSpinBox(this);
  seed_->setObjectName(QStringLiteral("seed"));
  setRangeFromTable(seed_, "seed");
  seed_->setValue(1);
  random_seed_ = new QCheckBox(tr("Random"), this);
  random_seed_->setToolTip(tr("Pick a new seed for every Generate"));
  seed_row->addWidget(seed_, 1);
  seed_row->addWidget(random_seed_);
  form->addRow(tr("Seed"), seed_row);
  connect(random_seed_, &QCheckBox::toggled, seed_, &QWidget::setDisabled);

  steps_ = new QSpinBox(this);
  steps_->setObjectName(QStringLiteral("steps"));
  setRangeFromTable(steps_, "steps");
  steps_->setValue(16);
  form->addRow(tr("Steps"), steps_);

  strength_ = new QDoubleSpinBox(this);
  strength_->setObjectName(QStringLiteral("strength"));
  setRangeFromTable(strength_, "strength");
  strength_->setSingleStep(0.05);
  strength_->setValue(1.0);
  form->addRow(tr("Strength"), strength_);

  guidance_ = new QDoubleSpinBox(this);
  guidance_->setObjectName(QStringLiteral("guidance"));
  setRangeFromTable(guidance_, "guidance");
  guidance_->setSingleStep(0.5);
  guidance_->setValue(3.0);
  form->addRow(tr("Guidance"), guidance_);

  variations_ = new QSpinBox(this);
  variations_->setRange(1, 8);
  variations_->setValue(1);
  form->addRow(tr("Variations"), variations_);

  feather_ = new QDoubleSpinBox(this);
  feather_->setObjectName(QStringLiteral("feather_px"));
  setRangeFromTable(feather_, "feather_px");
  feather_->setValue(4.0);
  feather_->setSuffix(tr(" px"));
  feather_->setToolTip(tr("How softly the result blends into the image at the mask's edge"));
  form->addRow(tr("Feather"), feather_);

  adapters_ = new AdapterList(this);
  form->addRow(tr("LoRAs"), adapters_);
  references_ = new ReferenceStrip(this);
  form->addRow(tr("References"), references_);
  connect(adapters_, &AdapterList::changed, this, &ParametersPanel::paramsChanged);
  connect(references_, &ReferenceStrip::changed, this, &ParametersPanel::paramsChanged);
  connect(adapters_, &AdapterList::message, this, &ParametersPanel::message);
  connect(references_, &ReferenceStrip::message, this, &ParametersPanel::message);

  for (QSpinBox* s : {seed_, steps_, variations_})
    connect(s, qOverload<int>(&QSpinBox::valueChanged), this, &ParametersPanel::paramsChanged);
  for (QDoubleSpinBox* s : {strength_, guidance_, feather_})
    connect(s, qOverload<double>(&QDoubleSpinBox::valueChanged), this, &ParametersPanel::paramsChanged);
  connect(random_seed_, &QCheckBox::toggled, this, &ParametersPanel::paramsChanged);
  connect(model_, qOverload<int>(&QComboBox::currentIndexChanged), this, [this](int i) {
    if (i < 0 || i >= models_.size()) return;
    const ModelDescription& m = models_[i];
    model_->setToolTip(m.description);
    setPromptModel(m);
    adapters_->setModel(m.id);  // a LoRA is read for the model that applies it
    if (m.default_steps > 0) steps_->setValue(m.default_steps);
    if (m.default_guidance >= 1.0) guidance_->setValue(m.default_guidance);
    emit paramsChanged();
  });
}

void ParametersPanel::setModels(const QList<ModelDescription>& models) {
  // A reconnect lists the models again: keep the user's choice when the engine still has it
  // (and then keep the user's steps and guidance too).
  const QString previous = selectedModelId();
  int keep = -1;
  for (int i = 0; i < models.size(); ++i)
    if (models[i].id == previous) keep = i;
  models_ = models;
  QSignalBlocker block(model_);
  model_->clear();
  for (const ModelDescription& m : models) model_->addItem(m.name.isEmpty() ? m.id : m.name, m.id);
  const bool several = models.size() > 1;
  model_->setVisible(several);
  model_label_->setVisible(several);
  if (keep >= 0 || !models.isEmpty()) adapters_->setModel(models[keep >= 0 ? keep : 0].id);
  if (keep >= 0) {
    model_->setCurrentIndex(keep);
    model_->setToolTip(models[keep].description);
    setPromptModel(models[keep]);
  } else if (!models.isEmpty()) {
    model_->setCurrentIndex(0);
    const ModelDescription& m = models.front();
    model_->setToolTip(m.description);
    setPromptModel(m);
    if (m.default_steps > 0) steps_->setValue(m.default_steps);
    if (m.default_guidance >= 1.0) guidance_->setValue(m.default_guidance);
  }
}

void ParametersPanel::setPromptModel(const ModelDescription& m) {
  free_text_ = m.free_text;
  setVocabulary(m.vocabulary);
}

void ParametersPanel::setEngine(EngineConnection* engine) {
  adapters_->setEngine(engine);
  references_->setEngine(engine);
}

int ParametersPanel::uploadsPending() const { return adapters_->pending() + references_->pending(); }

void ParametersPanel::setVocabulary(const QStringList& words) {
  vocabulary_.clear();
  for (const QString& w : words) vocabulary_ << w.toLower();
  words_model_->setStringList(free_text_ ? QStringList() : vocabulary_);
  prompt_->setToolTip(free_text_             ? tr("Describe the change in your own words")
                      : vocabulary_.isEmpty() ? tr("This model takes no prompt")
                                              : tr("Words this model knows: %1").arg(vocabulary_.join(QStringLiteral(", "))));
  validatePrompt();
}

QStringList ParametersPanel::invalidWords() const {
  if (free_text_) return {};  // a text encoder reads any text
  return invalid_prompt_words(prompt_->text(), vocabulary_);
}

QString ParametersPanel::selectedModelId() const { return model_->currentData().toString(); }

bool ParametersPanel::selectModel(const QString& id) {
  const int i = model_->findData(id);
  if (i < 0) return false;
  model_->setCurrentIndex(i);  // emits paramsChanged (through currentIndexChanged) when it changes
  return true;
}

GenerationParams ParametersPanel::params() const {
  GenerationParams p;
  // Free text goes as typed; vocabulary words as the engine splits them.
  p.prompt = free_text_ ? prompt_->text().trimmed() : prompt_words(prompt_->text()).join(QLatin1Char(' '));
  p.seed = static_cast<quint64>(seed_->value());
  p.model_id = selectedModelId();
  p.random_seed = random_seed_->isChecked();
  p.steps = steps_->value();
  p.strength = strength_->value();
  p.guidance = guidance_->value();
  p.variations = variations_->value();
  p.feather_px = feather_->value();
  p.adapters = adapters_->adapters();
  p.references = references_->references();
  p.reference_files = references_->referenceFiles();
  return p;
}

void ParametersPanel::showUsedSeed(quint64 seed) {
  if (random_seed_->isChecked() && seed <= static_cast<quint64>(seed_->maximum())) {
    QSignalBlocker block(seed_);
    seed_->setValue(static_cast<int>(seed));
  }
}

void ParametersPanel::validatePrompt() {
  const QStringList bad = invalidWords();
  const bool valid = bad.isEmpty();
  if (valid) {
    prompt_->setStyleSheet(QString());
    prompt_error_->setVisible(false);
  } else {
    prompt_->setStyleSheet(QStringLiteral("QLineEdit { border: 2px solid #e04050; }"));
    prompt_error_->setText(vocabulary_.isEmpty() ? tr("This model takes no prompt")
                                                 : tr("Unknown word(s): %1").arg(bad.join(QStringLiteral(", "))));
    prompt_error_->setVisible(true);
  }
  if (valid != was_valid_) {
    was_valid_ = valid;
    emit validityChanged(valid);
  }
}

void ParametersPanel::updateCompletionPrefix() {
  const QString text = prompt_->text();
  const int cursor = prompt_->cursorPosition();
  const QString word = text.mid(word_start(text, cursor), cursor - word_start(text, cursor));
  if (word.isEmpty() || vocabulary_.isEmpty() || free_text_) {
    completer_->popup()->hide();
    return;
  }
  completer_->setCompletionPrefix(word);
  if (completer_->completionCount() == 0) {
    completer_->popup()->hide();
    return;
  }
  completer_->complete();
}

void ParametersPanel::completeWord(const QString& word) {
  QString text = prompt_->text();
  const int cursor = prompt_->cursorPosition();
  const int start = word_start(text, cursor);
  text.replace(start, cursor - start, word + QLatin1Char(' '));
  prompt_->setText(text);
  prompt_->setCursorPosition(start + static_cast<int>(word.size()) + 1);
}

}  // namespace infill::ui
