/* Pixels of more than 8 bits in and out of TIFF files, for the layers the GIMP plug-in sends at
 * their precision: 16-bit unsigned or 32-bit float samples, 1 to 4 interleaved channels, as
 * libtiff reads and writes them (any compression and predictor on reading). */
#ifndef INFILL_GIMP_TIFF_PIXELS_H
#define INFILL_GIMP_TIFF_PIXELS_H

#include <glib.h>

typedef struct {
  gint width, height, channels;
  gboolean is_float; /* 32-bit IEEE float samples; else 16-bit unsigned */
  guchar* data;      /* width * height * channels samples, row by row; g_free it */
} TiffPixels;

/* Writes `p` to `path` (deflate, one strip per 64 rows). NULL, or a message naming the file. */
gchar* tiff_pixels_write(const char* path, const TiffPixels* p);

/* Reads a TIFF of 16-bit unsigned or 32-bit float samples into `out`. NULL, or a message naming
 * the file and what it holds instead. */
gchar* tiff_pixels_read(const char* path, TiffPixels* out);

#endif
