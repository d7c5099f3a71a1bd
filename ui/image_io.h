#pragma once
/// @file
/// Reading and writing images through OpenImageIO (PNG, JPEG, TIFF, EXR, PSD, ...).

#include <QImage>
#include <QString>
#include <QStringList>

namespace infill::ui {

/// An image read for display and editing.
struct LoadedImage {
  /// Format_RGBA8888 (straight alpha; opaque when the file has none). Null on failure.
  QImage image;
  QString error;        ///< why reading failed, naming the file
  int channels = 0;     ///< of the file
  QString pixel_type;   ///< of the file: "uint8", "uint16", "half", "float", ...
  QString format_name;  ///< OpenImageIO's format name: "png", "openexr", "psd", ...
};

/// Reads the first subimage (for PSD, the flattened composite) and converts it to 8-bit RGBA.
/// Float data (EXR) is clamped to [0, 1] and shown as is (no view transform). Thread-safe.
LoadedImage load_image(const QString& path);

/// Writes `image` to `path`; the format comes from the extension (.png, .tif/.tiff, .exr,
/// anything OpenImageIO writes). EXR is written as half float. Returns "" on success, else why.
QString save_image(const QImage& image, const QString& path);

/// Name filters for file dialogs, e.g. "Images (*.png *.jpg ...)".
QString image_file_filter();

/// Lower-case extensions (without dot) the editor opens.
QStringList readable_extensions();

}  // namespace infill::ui
