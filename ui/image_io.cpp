#include "ui/image_io.h"

#include <QFile>
#include <QFileInfo>
#include <QSaveFile>

#include <OpenImageIO/color.h>
#include <OpenImageIO/filesystem.h>
#include <OpenImageIO/imageio.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace infill::ui {

namespace {

QString q(const std::string& s) { return QString::fromStdString(s); }

// OIIO picks its reader by the name's extension: the content's own when recognised, so a file
// named ".png" that holds a TIFF still decodes.
std::string reader_name(const QByteArray& file, const QString& name) {
  auto starts = [&](const char* magic, int n) { return file.size() >= n && std::memcmp(file.constData(), magic, n) == 0; };
  if (starts("\x89PNG", 4)) return "image.png";
  if (starts("II*\0", 4) || starts("MM\0*", 4)) return "image.tif";
  if (starts("\x76\x2f\x31\x01", 4)) return "image.exr";
  if (starts("\xff\xd8\xff", 3)) return "image.jpg";
  if (starts("8BPS", 4)) return "image.psd";
  return QFileInfo(name).fileName().toStdString();
}

// OIIO reads OpenEXR (and HDR) as scene-linear light.
bool is_scene_linear(const OIIO::ImageSpec& spec) {
  const bool is_float = spec.format == OIIO::TypeDesc::HALF || spec.format == OIIO::TypeDesc::FLOAT;
  const std::string cs = OIIO::Strutil::lower(spec.get_string_attribute("oiio:ColorSpace"));
  return is_float && (cs == "linear" || cs == "scene_linear" || cs == "lin_srgb");
}

// OpenColorIO's linear -> sRGB through OIIO ($OCIO's config, else the built-in one); null
// when the config has no such spaces (then float data is shown clamped, as is).
const OIIO::ColorConfig& colour_config() {
  static const OIIO::ColorConfig config;
  return config;
}

const OIIO::ColorProcessorHandle& view_transform() {
  static const OIIO::ColorProcessorHandle processor = colour_config().createColorProcessor("linear", "sRGB");
  return processor;
}

// Its inverse, for pictures written into OpenEXR.
const OIIO::ColorProcessorHandle& linear_transform() {
  static const OIIO::ColorProcessorHandle processor = colour_config().createColorProcessor("sRGB", "linear");
  return processor;
}

}  // namespace

LoadedImage load_image(const QString& path) {
  QFile in(path);
  if (!in.open(QIODevice::ReadOnly)) {
    LoadedImage out;
    out.error = QStringLiteral("%1: cannot open the image (%2)").arg(path, in.errorString());
    return out;
  }
  return decode_image_file(in.readAll(), path);
}

LoadedImage decode_image_file(const QByteArray& file, const QString& name) {
  LoadedImage out;
  out.file = file;
  OIIO::Filesystem::IOMemReader reader(file.constData(), static_cast<size_t>(file.size()));
  auto in = OIIO::ImageInput::open(reader_name(file, name), nullptr, &reader);
  if (!in) {
    out.error = QStringLiteral("%1: cannot open the image (%2)").arg(name, q(OIIO::geterror()));
    return out;
  }
  const OIIO::ImageSpec& spec = in->spec();
  if (spec.width <= 0 || spec.height <= 0 || spec.nchannels <= 0) {
    out.error = QStringLiteral("%1: the image is %2x%3 with %4 channels, expected a non-empty image")
                    .arg(name).arg(spec.width).arg(spec.height).arg(spec.nchannels);
    return out;
  }
  out.channels = spec.nchannels;
  out.pixel_type = QString::fromLatin1(spec.format.c_str());
  out.format_name = QString::fromLatin1(in->format_name());

  // Up to four channels: grey, grey + alpha, RGB or RGBA (extra channels are not pictures).
  // Read as float whatever the depth: 8-bit samples come back exact after the rounding below.
  const int n = std::min(spec.nchannels, 4);
  const size_t count = static_cast<size_t>(spec.width) * static_cast<size_t>(spec.height);
  std::vector<float> pixels(count * static_cast<size_t>(n));
  if (!in->read_image(0, 0, 0, n, OIIO::TypeDesc::FLOAT, pixels.data())) {
    out.error = QStringLiteral("%1: cannot read the pixels (%2)").arg(name, q(in->geterror()));
    return out;
  }
  if (is_scene_linear(spec) && n >= 3) {
    if (const auto& view = view_transform())
      view->apply(pixels.data(), spec.width, spec.height, 3, sizeof(float), static_cast<OIIO::stride_t>(n * sizeof(float)),
                  static_cast<OIIO::stride_t>(spec.width) * n * static_cast<OIIO::stride_t>(sizeof(float)));
  } else if (is_scene_linear(spec) && view_transform()) {
    for (size_t i = 0; i < count; ++i) {
      float rgb[3] = {pixels[i * n], pixels[i * n], pixels[i * n]};
      view_transform()->apply(rgb);
      pixels[i * n] = rgb[0];
    }
  }
  in->close();
  auto to_u8 = [](float v) { return static_cast<uint8_t>(std::lround(std::clamp(v == v ? v : 0.0f, 0.0f, 1.0f) * 255.0f)); };

  QImage image(spec.width, spec.height, QImage::Format_RGBA8888);
  for (int y = 0; y < spec.height; ++y) {
    uint8_t* dst = image.scanLine(y);
    const float* src = pixels.data() + static_cast<size_t>(y) * static_cast<size_t>(spec.width) * static_cast<size_t>(n);
    for (int x = 0; x < spec.width; ++x, src += n, dst += 4) {
      switch (n) {
        case 1: dst[0] = dst[1] = dst[2] = to_u8(src[0]); dst[3] = 255; break;
        case 2: dst[0] = dst[1] = dst[2] = to_u8(src[0]); dst[3] = to_u8(src[1]); break;
        case 3: dst[0] = to_u8(src[0]); dst[1] = to_u8(src[1]); dst[2] = to_u8(src[2]); dst[3] = 255; break;
        default: for (int c = 0; c < 4; ++c) dst[c] = to_u8(src[c]); break;
      }
    }
  }
  out.image = std::move(image);
  return out;
}

QString save_image_file(const QByteArray& file, const QString& path) {
  if (file.isEmpty()) return QStringLiteral("%1: there is no image to write").arg(path);
  OIIO::Filesystem::IOMemReader reader(file.constData(), static_cast<size_t>(file.size()));
  auto in = OIIO::ImageInput::open(reader_name(file, path), nullptr, &reader);
  if (!in) return QStringLiteral("%1: the image to write cannot be read (%2)").arg(path, q(OIIO::geterror()));
  auto output = OIIO::ImageOutput::create(path.toStdString());
  if (!output) return QStringLiteral("%1: no writer for this file type (%2)").arg(path, q(OIIO::geterror()));
  if (std::string(output->format_name()) == in->format_name()) {
    // The file's own format: its bytes, depth, profile and metadata exactly.
    QSaveFile out(path);
    if (!out.open(QIODevice::WriteOnly) || out.write(file) != file.size() || !out.commit())
      return QStringLiteral("%1: cannot write (%2)").arg(path, out.errorString());
    return {};
  }
  OIIO::ImageSpec spec = in->spec();
  std::vector<std::byte> pixels(spec.image_bytes(true));
  if (!in->read_image(0, 0, 0, spec.nchannels, spec.format, pixels.data()))
    return QStringLiteral("%1: the image to write cannot be decoded (%2)").arg(path, q(in->geterror()));
  const bool is_float = spec.format == OIIO::TypeDesc::HALF || spec.format == OIIO::TypeDesc::FLOAT;
  const bool integer_target = std::string(output->format_name()) != "openexr" && std::string(output->format_name()) != "tiff";
  if (is_float && integer_target) {
    // Float into PNG (or JPEG, ...): through the view transform when linear, then 16 bits.
    std::vector<float> f(spec.image_pixels() * static_cast<size_t>(spec.nchannels));
    if (!in->read_image(0, 0, 0, spec.nchannels, OIIO::TypeDesc::FLOAT, f.data()))
      return QStringLiteral("%1: the image to write cannot be decoded (%2)").arg(path, q(in->geterror()));
    if (is_scene_linear(spec) && spec.nchannels >= 3 && view_transform())
      view_transform()->apply(f.data(), spec.width, spec.height, 3, sizeof(float),
                              static_cast<OIIO::stride_t>(spec.nchannels * sizeof(float)),
                              static_cast<OIIO::stride_t>(spec.width) * spec.nchannels * static_cast<OIIO::stride_t>(sizeof(float)));
    for (float& v : f) v = std::clamp(v == v ? v : 0.0f, 0.0f, 1.0f);
    spec.format = OIIO::TypeDesc::UINT16;
    spec.erase_attribute("oiio:ColorSpace");
    pixels.resize(f.size() * sizeof(uint16_t));
    auto* dst = reinterpret_cast<uint16_t*>(pixels.data());
    for (size_t i = 0; i < f.size(); ++i) dst[i] = static_cast<uint16_t>(std::lround(f[i] * 65535.0f));
  }
  const QString temp = path + QStringLiteral(".infill-tmp");
  bool ok = output->open(temp.toStdString(), spec) && output->write_image(spec.format, pixels.data());
  ok = output->close() && ok;
  if (!ok) {
    QFile::remove(temp);
    return QStringLiteral("%1: cannot write (%2)").arg(path, q(output->geterror()));
  }
  QFile::remove(path);
  if (!QFile::rename(temp, path)) {
    QFile::remove(temp);
    return QStringLiteral("%1: cannot write (rename failed)").arg(path);
  }
  return {};
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
  bool ok = false;
  if (exr) {
    // OpenEXR holds linear light: the 8-bit sRGB picture is decoded through the inverse of
    // the view transform decode_image_file shows EXR with.
    std::vector<float> f(static_cast<size_t>(src.width()) * src.height() * n);
    for (int y = 0; y < src.height(); ++y) {
      const uint8_t* row = src.constScanLine(y);
      for (int x = 0; x < src.width(); ++x)
        for (int c = 0; c < n; ++c) f[(static_cast<size_t>(y) * src.width() + x) * n + c] = row[x * pixel_bytes + c] / 255.0f;
    }
    if (n >= 3 && linear_transform())
      linear_transform()->apply(f.data(), src.width(), src.height(), 3, sizeof(float), static_cast<OIIO::stride_t>(n * sizeof(float)),
                                static_cast<OIIO::stride_t>(src.width()) * n * static_cast<OIIO::stride_t>(sizeof(float)));
    ok = output->write_image(OIIO::TypeDesc::FLOAT, f.data());
  } else {
    // Rows of a QImage are bytesPerLine() apart; OIIO takes the strides.
    ok = output->write_image(OIIO::TypeDesc::UINT8, src.constBits(), pixel_bytes,
                             static_cast<OIIO::stride_t>(src.bytesPerLine()));
  }
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
