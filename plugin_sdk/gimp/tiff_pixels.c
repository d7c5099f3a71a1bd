#include "tiff_pixels.h"

#include <tiffio.h>

static gsize sample_bytes(const TiffPixels* p) { return p->is_float ? 4 : 2; }

gchar* tiff_pixels_write(const char* path, const TiffPixels* p) {
  TIFF* t = TIFFOpen(path, "w");
  gsize row_bytes = (gsize)p->width * p->channels * sample_bytes(p);
  gint y;
  if (!t) return g_strdup_printf("cannot create %s", path);
  TIFFSetField(t, TIFFTAG_IMAGEWIDTH, (uint32_t)p->width);
  TIFFSetField(t, TIFFTAG_IMAGELENGTH, (uint32_t)p->height);
  TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, (uint16_t)p->channels);
  TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, (uint16_t)(p->is_float ? 32 : 16));
  TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, (uint16_t)(p->is_float ? SAMPLEFORMAT_IEEEFP : SAMPLEFORMAT_UINT));
  TIFFSetField(t, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  TIFFSetField(t, TIFFTAG_PHOTOMETRIC, p->channels >= 3 ? PHOTOMETRIC_RGB : PHOTOMETRIC_MINISBLACK);
  TIFFSetField(t, TIFFTAG_COMPRESSION, COMPRESSION_ADOBE_DEFLATE);
  TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, (uint32_t)64);
  if (p->channels == 2 || p->channels == 4) {
    /* Straight (unassociated) alpha: the layer's colour is not premultiplied. */
    uint16_t extra = EXTRASAMPLE_UNASSALPHA;
    TIFFSetField(t, TIFFTAG_EXTRASAMPLES, (uint16_t)1, &extra);
  }
  for (y = 0; y < p->height; ++y) {
    if (TIFFWriteScanline(t, p->data + (gsize)y * row_bytes, (uint32_t)y, 0) < 0) {
      TIFFClose(t);
      return g_strdup_printf("writing row %d of %s failed", y, path);
    }
  }
  TIFFClose(t);
  return NULL;
}

gchar* tiff_pixels_read(const char* path, TiffPixels* out) {
  TIFF* t = TIFFOpen(path, "r");
  uint32_t w = 0, h = 0;
  uint16_t spp = 0, bps = 0, format = SAMPLEFORMAT_UINT, planar = PLANARCONFIG_CONTIG;
  gsize row_bytes;
  uint32_t y;
  if (!t) return g_strdup_printf("cannot read %s as TIFF", path);
  TIFFGetField(t, TIFFTAG_IMAGEWIDTH, &w);
  TIFFGetField(t, TIFFTAG_IMAGELENGTH, &h);
  TIFFGetFieldDefaulted(t, TIFFTAG_SAMPLESPERPIXEL, &spp);
  TIFFGetFieldDefaulted(t, TIFFTAG_BITSPERSAMPLE, &bps);
  TIFFGetFieldDefaulted(t, TIFFTAG_SAMPLEFORMAT, &format);
  TIFFGetFieldDefaulted(t, TIFFTAG_PLANARCONFIG, &planar);
  if (w == 0 || h == 0 || spp < 1 || spp > 4 || planar != PLANARCONFIG_CONTIG ||
      !((bps == 16 && format == SAMPLEFORMAT_UINT) || (bps == 32 && format == SAMPLEFORMAT_IEEEFP))) {
    TIFFClose(t);
    return g_strdup_printf("%s is %ux%u with %u channels of %u-bit %s samples, expected 1 to 4 interleaved "
                           "channels of 16-bit unsigned or 32-bit float samples",
                           path, w, h, spp, bps, format == SAMPLEFORMAT_IEEEFP ? "float" : "integer");
  }
  out->width = (gint)w;
  out->height = (gint)h;
  out->channels = spp;
  out->is_float = bps == 32;
  row_bytes = (gsize)w * spp * sample_bytes(out);
  out->data = g_try_malloc(row_bytes * h);
  if (!out->data) {
    TIFFClose(t);
    return g_strdup_printf("out of memory reading %s (%ux%u)", path, w, h);
  }
  for (y = 0; y < h; ++y) {
    if (TIFFReadScanline(t, out->data + (gsize)y * row_bytes, y, 0) < 0) {
      TIFFClose(t);
      g_free(out->data);
      out->data = NULL;
      return g_strdup_printf("reading row %u of %s failed", y, path);
    }
  }
  TIFFClose(t);
  return NULL;
}
