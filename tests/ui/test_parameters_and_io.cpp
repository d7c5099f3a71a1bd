// The parameters panel (vocabulary completions, invalid words flagged before submission) and
// image files through OpenImageIO (PNG, TIFF, EXR, PSD-style reads, export with a mask).
#include <catch2/catch.hpp>

#include <QAbstractItemView>
#include <QCompleter>
#include <QDragEnterEvent>
#include <QDoubleSpinBox>
#include <QDropEvent>
#include <QFile>
#include <QLineEdit>
#include <QMimeData>
#include <QUrl>
#include <QSettings>
#include <QSpinBox>
#include <QTemporaryDir>

#include <infill_protocol/edit_parameters.h>

#include "tests/ui/ui_test_support.h"
#include "ui/adapter_list.h"
#include "ui/image_io.h"
#include "ui/main_window.h"
#include "ui/parameters_panel.h"
#include "ui/reference_strip.h"

using infill::test::source_path;
using infill::test::ui_app;

TEST_CASE("Prompt words outside the model vocabulary are flagged as the engine splits them", "[ui][params]") {
  ui_app();
  const QStringList vocabulary{QStringLiteral("red"), QStringLiteral("green"), QStringLiteral("dark")};
  CHECK(infill::ui::invalid_prompt_words(QStringLiteral("Red, dark  green"), vocabulary).isEmpty());
  CHECK(infill::ui::invalid_prompt_words(QStringLiteral("red purple,blu red"), vocabulary) ==
        QStringList{QStringLiteral("purple"), QStringLiteral("blu")});
  CHECK(infill::ui::invalid_prompt_words(QString(), vocabulary).isEmpty());
  CHECK(infill::ui::invalid_prompt_words(QStringLiteral("red"), {}) == QStringList{QStringLiteral("red")});

  infill::ui::ParametersPanel panel;
  infill::ui::ModelDescription model;
  model.id = QStringLiteral("infill-tiny-1");
  model.name = QStringLiteral("infill-tiny");
  model.vocabulary = vocabulary;
  model.default_steps = 12;
  model.default_guidance = 2.5;
  panel.setModels({model});
  CHECK(panel.params().steps == 12);
  CHECK(panel.params().guidance == Approx(2.5));
  bool last_valid = true;
  QObject::connect(&panel, &infill::ui::ParametersPanel::validityChanged, [&](bool v) { last_valid = v; });
  panel.promptEdit()->setText(QStringLiteral("green purple"));
  CHECK_FALSE(last_valid);
  CHECK(panel.invalidWords() == QStringList{QStringLiteral("purple")});
  panel.promptEdit()->setText(QStringLiteral("GREEN, dark"));
  CHECK(last_valid);
  CHECK(panel.params().prompt == QStringLiteral("green dark"));

  // Completions come from the vocabulary.
  QCompleter* completer = panel.promptEdit()->findChild<QCompleter*>();
  if (!completer) completer = panel.findChild<QCompleter*>();
  REQUIRE(completer);
  completer->setCompletionPrefix(QStringLiteral("da"));
  CHECK(completer->currentCompletion() == QStringLiteral("dark"));
}

TEST_CASE("A free-text model takes any prompt as written, without word checks or completion", "[ui][params]") {
  ui_app();
  infill::ui::ParametersPanel panel;
  infill::ui::ModelDescription words, text;
  words.id = QStringLiteral("infill-tiny-1");
  words.vocabulary = {QStringLiteral("red")};
  text.id = QStringLiteral("flux2-klein");
  text.free_text = true;
  panel.setModels({words, text});
  bool last_valid = true;
  QObject::connect(&panel, &infill::ui::ParametersPanel::validityChanged, [&](bool v) { last_valid = v; });
  panel.promptEdit()->setText(QStringLiteral("Make the cup RED, with a soft highlight"));
  CHECK_FALSE(last_valid);  // the vocabulary model knows one word
  REQUIRE(panel.selectModel(QStringLiteral("flux2-klein")));
  CHECK(last_valid);
  CHECK(panel.invalidWords().isEmpty());
  CHECK(panel.params().prompt == QStringLiteral("Make the cup RED, with a soft highlight"));
  CHECK(panel.promptEdit()->toolTip().contains(QStringLiteral("own words")));
  // Back on the vocabulary model, the same text is flagged again.
  REQUIRE(panel.selectModel(QStringLiteral("infill-tiny-1")));
  CHECK_FALSE(last_valid);
}

TEST_CASE("The Generate action refuses an invalid prompt before anything is submitted", "[ui][params]") {
  ui_app();
  infill::ui::MainWindow window;
  infill::ui::ModelDescription model;
  model.vocabulary = {QStringLiteral("blue")};
  window.parameters()->setModels({model});
  window.parameters()->promptEdit()->setText(QStringLiteral("blue sky"));
  REQUIRE(window.openImage(source_path(QStringLiteral("resources/jobs/hills_256.png"))));
  CHECK_FALSE(window.action(QStringLiteral("generate"))->isEnabled());
  window.parameters()->promptEdit()->setText(QStringLiteral("blue"));
  CHECK(window.action(QStringLiteral("generate"))->isEnabled());
}

TEST_CASE("Images read through OpenImageIO and export as PNG TIFF and EXR", "[ui][io]") {
  ui_app();
  QTemporaryDir dir;
  infill::ui::LoadedImage png = infill::ui::load_image(source_path(QStringLiteral("resources/jobs/hills_256.png")));
  REQUIRE(png.error.isEmpty());
  REQUIRE(png.image.size() == QSize(256, 256));
  CHECK(png.channels == 3);
  CHECK(png.image.format() == QImage::Format_RGBA8888);
  // The same pixels Qt's own PNG reader sees.
  const QImage reference = QImage(source_path(QStringLiteral("resources/jobs/hills_256.png"))).convertToFormat(QImage::Format_RGBA8888);
  CHECK(png.image == reference);

  for (const char* ext : {"png", "tif", "exr"}) {
    const QString path = dir.filePath(QStringLiteral("out.") + QLatin1String(ext));
    INFO(path.toStdString());
    REQUIRE(infill::ui::save_image(png.image, path).isEmpty());
    infill::ui::LoadedImage back = infill::ui::load_image(path);
    REQUIRE(back.error.isEmpty());
    REQUIRE(back.image.size() == png.image.size());
    if (QLatin1String(ext) != QLatin1String("exr")) {
      CHECK(back.image == png.image);  // lossless 8-bit
    } else {
      CHECK(back.pixel_type == QStringLiteral("half"));
      // Half floats hold every 8-bit level to within rounding.
      const QColor a = png.image.pixelColor(100, 100), b = back.image.pixelColor(100, 100);
      CHECK(std::abs(a.red() - b.red()) <= 1);
      CHECK(std::abs(a.blue() - b.blue()) <= 1);
    }
  }

  infill::ui::LoadedImage missing = infill::ui::load_image(dir.filePath(QStringLiteral("nope.png")));
  CHECK(missing.image.isNull());
  CHECK(missing.error.contains(QStringLiteral("nope.png")));
}

TEST_CASE("Export writes the result and on request the mask as a separate PNG", "[ui][io]") {
  ui_app();
  QTemporaryDir dir;
  infill::ui::MainWindow window;
  REQUIRE(window.openImage(source_path(QStringLiteral("resources/jobs/hills_256.png"))));
  window.maskDocument()->fillRect(QRectF(10, 20, 30, 40));
  const QString out = dir.filePath(QStringLiteral("result.tif"));
  REQUIRE(window.exportImage(window.canvas()->image(), window.documentFile(), out, true).isEmpty());
  CHECK(QFileInfo::exists(out));
  const QImage mask(dir.filePath(QStringLiteral("result_mask.png")));
  REQUIRE(!mask.isNull());
  CHECK(mask.convertToFormat(QImage::Format_Grayscale8) == window.maskDocument()->mask());
  REQUIRE(window.exportImage(window.canvas()->image(), {}, dir.filePath(QStringLiteral("plain.png")), false).isEmpty());
  CHECK_FALSE(QFileInfo::exists(dir.filePath(QStringLiteral("plain_mask.png"))));
}

TEST_CASE("Opening an image records it in the recent files and a bad file gives a message", "[ui][io]") {
  ui_app();
  infill::ui::MainWindow window;
  const QString path = source_path(QStringLiteral("resources/jobs/dusk_256.png"));
  REQUIRE(window.openImage(path));
  CHECK(QSettings().value(QStringLiteral("recent_files")).toStringList().value(0) == QFileInfo(path).absoluteFilePath());
  CHECK_FALSE(window.openImage(QStringLiteral("/nonexistent/picture.exr")));
  CHECK(window.currentPath() == path);  // the open image stays
}

TEST_CASE("Applying a result puts it into the canvas as one undoable step", "[ui][results]") {
  ui_app();
  infill::ui::MainWindow window;
  REQUIRE(window.openImage(source_path(QStringLiteral("resources/jobs/hills_256.png"))));
  const QImage original = window.canvas()->image();
  window.maskDocument()->fillRect(QRectF(10, 10, 50, 50));
  infill::ui::GenerationResult r;
  r.image = original.copy();
  for (int y = 10; y < 60; ++y)
    for (int x = 10; x < 60; ++x) r.image.setPixelColor(x, y, QColor(20, 200, 40));
  r.seed = 5;
  r.file = QByteArrayLiteral("the engine's result file");  // what the next upload and exports use
  window.results()->addResult(r);
  window.results()->setCurrentRow(0);
  CHECK(window.action(QStringLiteral("apply"))->isEnabled());
  const int undo_before = window.undoStack()->count();
  window.action(QStringLiteral("apply"))->trigger();
  CHECK(window.canvas()->image() == r.image);
  CHECK(window.controller()->image() == r.image);  // the next edit starts from the result
  CHECK(window.documentFile() == r.file);  // at the result file's depth, not the display's
  CHECK(window.undoStack()->count() == undo_before + 1);
  window.undoStack()->undo();
  CHECK(window.canvas()->image() == original);
  CHECK(window.documentFile() == infill::ui::load_image(source_path(QStringLiteral("resources/jobs/hills_256.png"))).file);
  window.undoStack()->undo();  // and the mask step before it
  CHECK(window.maskDocument()->isEmpty());
  window.undoStack()->redo();
  window.undoStack()->redo();
  CHECK(window.canvas()->image() == r.image);
}

TEST_CASE("Dropping an image file on the window opens it", "[ui][io]") {
  ui_app();
  infill::ui::MainWindow window;
  window.show();
  const QString path = source_path(QStringLiteral("resources/jobs/dusk_256.png"));
  QMimeData data;
  data.setUrls({QUrl::fromLocalFile(path)});
  QDragEnterEvent enter(QPoint(100, 100), Qt::CopyAction, &data, Qt::LeftButton, Qt::NoModifier);
  QCoreApplication::sendEvent(&window, &enter);
  CHECK(enter.isAccepted());
  QDropEvent drop(QPointF(100, 100), Qt::CopyAction, &data, Qt::LeftButton, Qt::NoModifier);
  QCoreApplication::sendEvent(&window, &drop);
  CHECK(window.currentPath() == path);
  CHECK(window.canvas()->image().size() == QSize(256, 256));

  QMimeData text;
  text.setUrls({QUrl::fromLocalFile(source_path(QStringLiteral("README.md")))});
  QDragEnterEvent refuse(QPoint(100, 100), Qt::CopyAction, &text, Qt::LeftButton, Qt::NoModifier);
  refuse.setAccepted(false);
  QCoreApplication::sendEvent(&window, &refuse);
  CHECK_FALSE(refuse.isAccepted());
}

TEST_CASE("The parameter panel's widgets offer the parameter table's editor ranges", "[ui][params]") {
  namespace proto = infill::protocol;
  ui_app();
  infill::ui::ParametersPanel panel;
  int widgets = 0;
  for (const proto::EditParameter& p : proto::kEditParameters) {
    // Strings have no range; the lists are checked below.
    if (!(p.clients & proto::kEditor) || p.type == proto::ParamType::kString ||
        p.type == proto::ParamType::kAdapterList || p.type == proto::ParamType::kTemplateList)
      continue;
    INFO(std::string(p.name));
    const QString name = QString::fromUtf8(p.name.data(), static_cast<int>(p.name.size()));
    if (auto* box = panel.findChild<QSpinBox*>(name)) {
      CHECK(box->minimum() == static_cast<int>(proto::editor_min(p)));
      CHECK(box->maximum() == static_cast<int>(proto::editor_max(p)));
      ++widgets;
    } else if (auto* dbox = panel.findChild<QDoubleSpinBox*>(name)) {
      CHECK(dbox->minimum() == proto::editor_min(p));
      CHECK(dbox->maximum() == proto::editor_max(p));
      ++widgets;
    } else {
      FAIL("no widget named " << p.name.data() << " in the parameter panel");
    }
    // The editor never offers a value the engine refuses.
    CHECK(proto::in_range(p, proto::editor_min(p)));
    CHECK(proto::in_range(p, proto::editor_max(p)));
  }
  CHECK(widgets == 5);  // seed, steps, strength, guidance, feather

  // The lists: a widget named after each, its most entries the table's max_length, and a LoRA
  // row's strength box the table's range (a row exists before any engine answers).
  int lists = 0;
  for (const proto::EditParameter& p : proto::kEditParameters) {
    if (!(p.clients & proto::kEditor)) continue;
    const QString name = QString::fromUtf8(p.name.data(), static_cast<int>(p.name.size()));
    INFO(std::string(p.name));
    if (p.type == proto::ParamType::kAdapterList) {
      auto* list = panel.findChild<infill::ui::AdapterList*>(name);
      REQUIRE(list);
      CHECK(infill::ui::AdapterList::maximumCount() == static_cast<int>(p.max_length));
      REQUIRE(list->addFile(source_path(QStringLiteral("README.md"))));
      REQUIRE(list->strengthBox(0));
      CHECK(list->strengthBox(0)->minimum() == proto::editor_min(p));
      CHECK(list->strengthBox(0)->maximum() == proto::editor_max(p));
      CHECK(list->strengthBox(0)->value() == 1.0);
      CHECK(proto::in_range(p, proto::editor_min(p)));
      CHECK(proto::in_range(p, proto::editor_max(p)));
      list->removeAt(0);
      ++lists;
    } else if (p.type == proto::ParamType::kTemplateList) {
      REQUIRE(panel.findChild<infill::ui::ReferenceStrip*>(name));
      CHECK(infill::ui::ReferenceStrip::maximumCount() == static_cast<int>(p.max_length));
      ++lists;
    }
  }
  CHECK(lists == 2);  // adapters, references
}

TEST_CASE("The LoRA list and the reference strip refuse what no edit could use, with a message", "[ui][params][lora]") {
  ui_app();
  QTemporaryDir dir;
  infill::ui::ParametersPanel panel;  // no engine: rows wait for one, so nothing is uploaded
  QStringList messages;
  QObject::connect(&panel, &infill::ui::ParametersPanel::message, [&](const QString& m, bool error) {
    if (error) messages << m;
  });
  infill::ui::AdapterList* loras = panel.adapterList();
  CHECK_FALSE(loras->addFile(dir.filePath(QStringLiteral("absent.safetensors"))));
  REQUIRE(messages.size() == 1);
  CHECK(messages.last().contains(QStringLiteral("absent.safetensors")));
  CHECK(messages.last().contains(QStringLiteral("does not exist")));
  for (int i = 0; i < infill::ui::AdapterList::maximumCount(); ++i)
    REQUIRE(loras->addFile(source_path(QStringLiteral("README.md"))));
  CHECK_FALSE(loras->addFile(source_path(QStringLiteral("README.md"))));
  CHECK(messages.last().contains(QStringLiteral("At most 8 LoRAs")));
  CHECK(loras->count() == 8);
  CHECK(loras->pending() == 8);  // none uploaded: the edits carry none of them yet
  CHECK(panel.params().adapters.isEmpty());
  CHECK(panel.uploadsPending() == 8);
  loras->removeAt(3);
  CHECK(loras->count() == 7);

  infill::ui::ReferenceStrip* strip = panel.referenceStrip();
  // Dropped files: the strip takes the drop (so the window does not open it as the picture)
  // and refuses a file that is not an image, naming it.
  QMimeData text;
  text.setUrls({QUrl::fromLocalFile(source_path(QStringLiteral("README.md")))});
  QDragEnterEvent enter(QPoint(5, 5), Qt::CopyAction, &text, Qt::LeftButton, Qt::NoModifier);
  enter.setAccepted(false);
  QCoreApplication::sendEvent(strip, &enter);
  CHECK(enter.isAccepted());
  QDropEvent drop(QPointF(5, 5), Qt::CopyAction, &text, Qt::LeftButton, Qt::NoModifier);
  QCoreApplication::sendEvent(strip, &drop);
  CHECK(strip->count() == 0);
  CHECK(messages.last().contains(QStringLiteral("Not a reference image")));
  CHECK(messages.last().contains(QStringLiteral("README.md")));
  // Images: distinct by their bytes, at most four.
  const QStringList images = {QStringLiteral("resources/jobs/dusk_256.png"), QStringLiteral("resources/jobs/hills_256.png"),
                              QStringLiteral("resources/jobs/dusk_256_mask.png"),
                              QStringLiteral("tests/data/golden/hills_128.png")};
  QMimeData two;
  two.setUrls({QUrl::fromLocalFile(source_path(images[0])), QUrl::fromLocalFile(source_path(images[1]))});
  QDragEnterEvent enter_two(QPoint(5, 5), Qt::CopyAction, &two, Qt::LeftButton, Qt::NoModifier);
  QCoreApplication::sendEvent(strip, &enter_two);
  QDropEvent drop_two(QPointF(5, 5), Qt::CopyAction, &two, Qt::LeftButton, Qt::NoModifier);
  QCoreApplication::sendEvent(strip, &drop_two);
  INFO(messages.join(QLatin1Char('\n')).toStdString());
  CHECK(strip->count() == 2);
  REQUIRE(QFile::copy(source_path(images[0]), dir.filePath(QStringLiteral("copy.png"))));
  CHECK_FALSE(strip->addFile(dir.filePath(QStringLiteral("copy.png"))));
  CHECK(messages.last().contains(QStringLiteral("already a reference image")));
  CHECK(strip->addFile(source_path(images[2])));
  CHECK(strip->addFile(source_path(images[3])));
  CHECK_FALSE(strip->addFile(source_path(QStringLiteral("resources/jobs/hills_256_mask.png"))));
  CHECK(messages.last().contains(QStringLiteral("At most 4 reference images")));
  CHECK(strip->count() == 4);
  CHECK(strip->pending() == 4);
  CHECK(panel.params().references.isEmpty());
  strip->removeAt(0);
  CHECK(strip->count() == 3);
}
