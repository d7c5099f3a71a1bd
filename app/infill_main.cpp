// infill: the Qt 6 editor. Thin main(): options, then the window (ui/main_window.h).
//   infill [--endpoint URL] [--token TOKEN] [--no-start-engine] [IMAGE]
//   infill --version
#include <QApplication>
#include <QCommandLineParser>
#include <QFileInfo>
#include <QIcon>

#include <cstdio>
#include <cstring>

#include "ui/main_window.h"

int main(int argc, char** argv) {
  // --version must work without a display, so it is answered before QApplication exists.
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0 || std::strcmp(argv[i], "-v") == 0) {
      std::printf("infill %s\n", INFILL_VERSION);
      return 0;
    }
  }
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("infill"));
  QApplication::setOrganizationName(QStringLiteral("infill"));
  QApplication::setApplicationVersion(QStringLiteral(INFILL_VERSION));
  QApplication::setDesktopFileName(QStringLiteral("infill"));
  // The installed hicolor icon; in a build tree, the PNG the installer target renders there.
  QIcon icon = QIcon::fromTheme(QStringLiteral("infill"));
  if (icon.isNull()) {
    const QString built = QCoreApplication::applicationDirPath() + QStringLiteral("/../installer/icons/256/infill.png");
    if (QFileInfo::exists(built)) icon = QIcon(built);
  }
  QApplication::setWindowIcon(icon);

  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral("Paint a mask, type a prompt, repaint the region."));
  parser.addHelpOption();
  parser.addVersionOption();
  QCommandLineOption endpoint(QStringLiteral("endpoint"),
                              QStringLiteral("Engine address: unix:/path/engine.sock or http://host:port "
                                             "(default: $INFILL_ENDPOINT, else the local engine)."),
                              QStringLiteral("URL"));
  QCommandLineOption token(QStringLiteral("token"), QStringLiteral("Bearer token of a remote engine."), QStringLiteral("TOKEN"));
  QCommandLineOption no_start(QStringLiteral("no-start-engine"),
                              QStringLiteral("Do not start a local engine when none answers."));
  parser.addOption(endpoint);
  parser.addOption(token);
  parser.addOption(no_start);
  parser.addPositionalArgument(QStringLiteral("image"), QStringLiteral("An image to open (PNG, JPEG, TIFF, EXR, PSD)."));
  parser.process(app);

  infill::ui::MainWindow window;
  window.show();
  infill::ui::EngineOptions options;
  options.endpoint = parser.value(endpoint);
  options.token = parser.value(token);
  options.auto_start = !parser.isSet(no_start);
  window.connectEngine(options);
  if (!parser.positionalArguments().isEmpty()) window.openImage(parser.positionalArguments().front());
  return app.exec();
}
