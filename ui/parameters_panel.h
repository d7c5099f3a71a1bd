#pragma once
/// @file
/// The generation parameters: prompt (with the model's vocabulary), seed, steps, strength,
/// guidance, variations, feather, model, LoRAs and reference images.

#include <QStringList>
#include <QWidget>

#include "ui/edit_controller.h"
#include "ui/engine_connection.h"

class QCheckBox;
class QComboBox;
class QCompleter;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QSpinBox;
class QStringListModel;

namespace infill::ui {

class AdapterList;
class ReferenceStrip;

/// Words of `prompt` (split on spaces and commas, lower-cased, as the engine does) that are
/// not in `vocabulary`. With an empty vocabulary every word is invalid (the model takes no
/// prompt).
QStringList invalid_prompt_words(const QString& prompt, const QStringList& vocabulary);

class ParametersPanel : public QWidget {
  Q_OBJECT

 public:
  explicit ParametersPanel(QWidget* parent = nullptr);

  /// The engine the LoRA list and the reference strip upload their files to.
  void setEngine(EngineConnection* engine);

  /// The engine's models; the selector shows only when there are several. Sets the
  /// vocabulary and defaults of the selected one.
  void setModels(const QList<ModelDescription>& models);
  void setVocabulary(const QStringList& words);
  /// The prompt rules of a model: its vocabulary, or free text (no checks, no completion).
  void setPromptModel(const ModelDescription& m);
  const QStringList& vocabulary() const { return vocabulary_; }

  GenerationParams params() const;
  /// Words the model does not know; empty when the prompt can be submitted.
  QStringList invalidWords() const;
  /// The id of the model edits should use ("" before the engine listed its models).
  QString selectedModelId() const;
  /// Selects the model with `id` (its defaults follow); false when the engine has none such.
  bool selectModel(const QString& id);

  QLineEdit* promptEdit() const { return prompt_; }
  AdapterList* adapterList() const { return adapters_; }
  ReferenceStrip* referenceStrip() const { return references_; }
  /// LoRAs and reference images whose upload has not answered yet: edits would go without them.
  int uploadsPending() const;
  /// The seed actually used by a random-seed Generate, shown for reuse.
  void showUsedSeed(quint64 seed);

 signals:
  void paramsChanged();
  /// Whether the prompt is valid changed.
  void validityChanged(bool valid);
  /// For the status bar: a file refused, a list full (error = true for failures).
  void message(const QString& text, bool error);

 private:
  void validatePrompt();
  void completeWord(const QString& word);
  void updateCompletionPrefix();

  QComboBox* model_ = nullptr;
  QLabel* model_label_ = nullptr;
  QLineEdit* prompt_ = nullptr;
  QLabel* prompt_error_ = nullptr;
  QCompleter* completer_ = nullptr;
  QStringListModel* words_model_ = nullptr;
  QSpinBox* seed_ = nullptr;
  QCheckBox* random_seed_ = nullptr;
  QSpinBox* steps_ = nullptr;
  QDoubleSpinBox* strength_ = nullptr;
  QDoubleSpinBox* guidance_ = nullptr;
  QSpinBox* variations_ = nullptr;
  QDoubleSpinBox* feather_ = nullptr;
  AdapterList* adapters_ = nullptr;
  ReferenceStrip* references_ = nullptr;
  QList<ModelDescription> models_;
  QStringList vocabulary_;
  bool free_text_ = false;  // the selected model reads free text: no word checks or completion
  bool was_valid_ = true;
};

}  // namespace infill::ui
