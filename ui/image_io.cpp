#include "ui/image_io.h"

#include <QFileInfo>

#include <OpenImageIO/imageio.h>

#include <algorithm>
#include <vector>

namespace infill::ui {

namespace {

QString q(const std::string& s) { return QString::fromStdString(s); }

}  // namespace

LoadedImage load_image(const QString& path) {
  LoadedImage out;
  const std::string file = path.toStdString();
  auto in = OIIO::ImageInput::open(file);
  if (!in) {
    out.error = QStringLiteral("%1: cannot open the image (%2)").arg(path, q(OIIO::geterror()));
    return out;
  }
  const OIIO::ImageSpec& spec = in->spec();
  if (spec.width <= 0 || spec.height <= 0 || spec.nchannels <= 0) {
    out.error = QStringLiteral("%1: the image is %2x%3 with %4 channels, expected a non-empty image")
                    .arg(path).arg(spec.width).arg(spec.height).arg(spec.nchannels);
    return out;
  }
  out.channels = spec.nchannels;
  out.pixel_type = QString::fromLatin1(spec.format.c_str());
  out.format_name = QString::fromLatin1(in->format_name());

  // Up to four channels: grey, grey + alpha, RGB or RGBA (extra channels are not pictures).
  const int n = std::min(spec.nchannels, 4);
  std::vector<uint8_t> pixels(static_cast<size_t>(spec.width) * static_cast<size_t>(spec.height) * static_cast<size_t>(n));
  if (!in->read_image(0, 0, 0, n, OIIO::TypeDesc::UINT8, pixels.data())) {
    out.error = QStringLiteral("%1: cannot read the pixels (%2)").arg(path, q(in->geterror()));
    return out;
  }
  in->close();

  QImage image(spec.width, spec.height, QImage::Format_RGBA8888);
  for (int y = 0; y < spec.height; ++y) {
    uint8_t* dst = image.scanLine(y);
    const uint8_t* src = pixels.data() + static_cast<size_t>(y) * static_cast<size_t>(spec.width) * static_cast<size_t>(n);
    for (int x = 0; x < spec.width; ++x, src += n, dst += 4) {
      switch (n) {
        case 1: dst[0] = dst[1] = dst[2] = src[0]; dst[3] = 255; break;
        case 2: dst[0] = dst[1] = dst[2] = src[0]; dst[3] = src[1]; break;
        case 3: dst[0] = src[0]; dst[1] = src[1]; dst[2] = src[2]; dst[3] = 255; break;
        default: std::copy_n(src, 4, dst); break;
      }
    }
  }
  out.image = std::move(image);
  return out;
}

QString save_image(const QImage& image, const QString& path) {
  if (image.isNull()) return QStringLiteral("%1: there is no image to write").arg(path);
  const std::string file = path.toStdString();
  auto output = OIIO::ImageOutput::create(file);
  if (!output) return QStringLiteral("%1: no writer for this file type (%2)").arg(path, q(OIIO::geterror()));

  const bool grey = image.format() == QImage::Format_Grayscale8;
  const QImage src = grey ? image : image.convertToFormat(QImage::Format_RGBA8888);
  // Opaque images are written as RGB: an all-255 alpha channel only costs space.
  bool opaque = true;
  for (int y = 0; y < src.height() && opaque && !grey; ++y) {
    const uint8_t* row = src.constScanLine(y);
    for (int x = 0; x < src.width(); ++x) {
      if (row[4 * x + 3] != 255) {
        opaque = false;
        break;
      }
    }
  }
  const int n = grey ? 1 : (opaque ? 3 : 4);
  const int pixel_bytes = grey ? 1 : 4;
  const bool exr = QFileInfo(path).suffix().compare(QStringLiteral("exr"), Qt::CaseInsensitive) == 0;
  OIIO::ImageSpec spec(src.width(), src.height(), n, exr ? OIIO::TypeDesc::HALF : OIIO::TypeDesc::UINT8);
  if (n == 4) spec.alpha_channel = 3;
  if (!output->open(file, spec)) return QStringLiteral("%1: cannot write (%2)").arg(path, q(output->geterror()));
  // Rows of a QImage are bytesPerLine() apart; OIIO takes the strides and converts uint8 to half.
  const bool ok = output->write_image(OIIO::TypeDesc::UINT8, src.constBits(), pixel_bytes,
                                      static_cast<OIIO::stride_t>(src.bytesPerLine()));
  const QString why = ok ? QString() : q(output->geterror());
  output->close();
  return ok ? QString() : QStringLiteral("%1: cannot write (%2)").arg(path, why);
}

QStringList readable_extensions() {
  return {QStringLiteral("png"), QStringLiteral("jpg"), QStringLiteral("jpeg"), QStringLiteral("tif"),
          QStringLiteral("tiff"), QStringLiteral("exr"), QStringLiteral("psd")};
}

QString image_file_filter() {
  QStringList globs;
  for (const QString& ext : readable_extensions()) globs << QStringLiteral("*.") + ext;
  return QStringLiteral("Images (%1);;All files (*)").arg(globs.join(QLatin1Char(' ')));
}

}  // namespace infill::ui
