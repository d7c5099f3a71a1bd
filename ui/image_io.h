#pragma once
/// @file
/// Reading and writing images through OpenImageIO (PNG, JPEG, TIFF, EXR, PSD, ...).

#include <QByteArray>
#include <QImage>
#include <QString>
#include <QStringList>

namespace infill::ui {

/// An image read for display and editing.
struct LoadedImage {
  /// For display only: Format_RGBA8888 (straight alpha; opaque when the file has none),
  /// scene-linear float data through the sRGB view transform, clamped. Null on failure.
  QImage image;
  /// The encoded file, byte for byte at its own depth: what the engine is sent and what
  /// exports start from, so nothing is lost to the 8-bit display.
  QByteArray file;
  QString error;        ///< why reading failed, naming the file
  int channels = 0;     ///< of the file
  QString pixel_type;   ///< of the file: "uint8", "uint16", "half", "float", ...
  QString format_name;  ///< OpenImageIO's format name: "png", "openexr", "psd", ...
};

/// Reads the file and decodes it with decode_image_file. Thread-safe.
LoadedImage load_image(const QString& path);

/// Decodes an encoded image in memory (the first subimage; for PSD, the flattened composite)
/// for display: 8-bit RGBA, through OpenColorIO's linear -> sRGB view transform (OpenImageIO's
/// colour management, $OCIO's config or the built-in one) when the file is scene-linear
/// (OpenEXR), then clamped. `file` is kept in the result; `name` labels errors. Thread-safe.
LoadedImage decode_image_file(const QByteArray& file, const QString& name);

/// Writes the encoded image `file` to `path` without losing depth: byte for byte when the
/// extension names the file's own format, else decoded and written in the samples' own type
/// where the target format holds it (16-bit PNG, half or float TIFF/EXR), OpenImageIO's
/// nearest otherwise. Returns "" on success, else why (naming `path`).
QString save_image_file(const QByteArray& file, const QString& path);

/// Writes `image` to `path`; the format comes from the extension (.png, .tif/.tiff, .exr,
/// anything OpenImageIO writes). EXR is written as half float of linear light (the sRGB
/// picture decoded through the inverse view transform). Returns "" on success, else why.
QString save_image(const QImage& image, const QString& path);

/// Name filters for file dialogs, e.g. "Images (*.png *.jpg ...)".
QString image_file_filter();

/// Lower-case extensions (without dot) the editor opens.
QStringList readable_extensions();

}  // namespace infill::ui
