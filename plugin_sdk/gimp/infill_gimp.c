/* infill-repaint: a GIMP 2.10 plug-in, Filters > Infill > Repaint selection...
 *
 * The active layer is the template and the image's selection the mask (0 = keep,
 * 255 = regenerate, grey = blend); the engine repaints the selected region and the result
 * becomes a new layer "Infill: <prompt>" above the active one, at the same offsets. A LoRA file
 * (FLUX.2 models) is uploaded to the engine's adapter store and applied at its strength. The
 * plug-in never loads a model: it talks to a running infill-engine through libinfill_client only.
 *
 * Threads: everything here runs on the plug-in's main thread. libinfill_client runs its own
 * thread for the engine's events, but the plug-in installs no callbacks: the main thread polls
 * the job (infill_job_wait with a short timeout, infill_job_progress) and drives GIMP's
 * progress bar, so no libgimp call is made from another thread.
 *
 * Cancel: GIMP's progress cancel button kills the plug-in process (SIGKILL after a quit
 * message), so the plug-in cannot cancel its edit itself. Before waiting, it starts a small
 * watcher, this same binary run as "infill-repaint --cancel-watch ENDPOINT EDIT_ID", whose
 * stdin is a pipe from the plug-in: when the pipe closes without the word "done", the plug-in
 * died and the watcher cancels the edit on the engine (infill_client_cancel_edit). */
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <libgimp/gimp.h>
#include <libgimp/gimpui.h>

#include <infill/infill_client.h>

#include "tiff_pixels.h"

#define PLUG_IN_PROC "plug-in-infill-repaint"
#define PLUG_IN_BINARY "infill-repaint"
#define PLUG_IN_ROLE "infill-repaint"
#define CANCEL_WATCH_ARG "--cancel-watch"

/* The procedure's settings; stored between runs with gimp_set_data (a flat struct: no
 * pointers). */
typedef struct {
  gchar prompt[512];
  gint32 seed; /* < 0: a new random seed on every run */
  gint32 random_seed;
  gint32 steps;          /* 0: the model's default */
  gdouble strength;      /* (0, 1]; 0: 1 */
  gdouble guidance;      /* [1, 20]; 0: the model's default */
  gchar endpoint[512];   /* "": the SDK's default (the local engine) */
  gchar token_file[512]; /* "": the SDK's lookup ($INFILL_TOKEN, ~/.config/infill/token) */
  /* Appended after 0.1 (settings stored by an older plug-in are shorter: these keep their
   * defaults). */
  gchar adapter_file[1024]; /* a LoRA .safetensors; "": none */
  gdouble adapter_strength; /* kAdapterStrengthMin..kAdapterStrengthMax */
} RepaintValues;

static const RepaintValues kDefaults = {"", 0, FALSE, 0, 1.0, 0.0, "", "", "", 1.0};

/* A LoRA's strength: the range of the "adapters" row of the parameter table
 * (protocol/infill_protocol/edit_parameters.h, C++); the GIMP test checks that they agree. */
static const gdouble kAdapterStrengthMin = -10.0;
static const gdouble kAdapterStrengthMax = 10.0;

/* The procedure's arguments: the first 10 were its whole list before the LoRA ones. */
#define NPARAMS_WITHOUT_ADAPTER 10
#define NPARAMS 12

static const char* g_self_path = NULL; /* argv[0]: the watcher is this binary */

static void query(void);
static void run(const gchar* name, gint nparams, const GimpParam* param, gint* nreturn_vals,
                GimpParam** return_vals);

const GimpPlugInInfo PLUG_IN_INFO = {NULL, NULL, query, run};

/* ---------------------------------------------------------------------------------------- */
/* Registration                                                                             */
/* ---------------------------------------------------------------------------------------- */

static void query(void) {
  static const GimpParamDef args[] = {
      {GIMP_PDB_INT32, "run-mode",
       "The run mode { RUN-INTERACTIVE (0), RUN-NONINTERACTIVE (1), RUN-WITH-LAST-VALS (2) }"},
      {GIMP_PDB_IMAGE, "image", "Input image"},
      {GIMP_PDB_DRAWABLE, "drawable",
       "The layer to repaint (the template); the image's selection is the mask"},
      {GIMP_PDB_STRING, "prompt", "Free text for models with a text encoder, else words of the model's vocabulary (\"\" for none)"},
      {GIMP_PDB_INT32, "seed", "Noise seed (>= 0), or -1 for a random seed"},
      {GIMP_PDB_INT32, "steps", "Denoising steps 1..1000, 0 = the model's default"},
      {GIMP_PDB_FLOAT, "strength", "How much to change the selection, (0, 1]; 0 = 1"},
      {GIMP_PDB_FLOAT, "guidance", "Prompt guidance [1, 20]; 0 = the model's default"},
      {GIMP_PDB_STRING, "endpoint",
       "The engine: \"unix:/path/engine.sock\" or \"http://HOST:PORT\"; \"\" = the local engine "
       "($INFILL_ENDPOINT, else unix:$XDG_RUNTIME_DIR/infill/engine.sock)"},
      {GIMP_PDB_STRING, "token-file",
       "File holding the engine's token for http:// endpoints; \"\" = $INFILL_TOKEN or "
       "~/.config/infill/token"},
      {GIMP_PDB_STRING, "adapter-file",
       "A LoRA file (.safetensors) for FLUX.2 models, uploaded to the engine and applied; \"\" = none"},
      {GIMP_PDB_FLOAT, "adapter-strength", "The LoRA's strength, -10..10 (1 = as trained)"},
  };
  static const GimpParamDef return_vals[] = {
      {GIMP_PDB_LAYER, "layer", "The new layer holding the result"},
  };

  gimp_install_procedure(
      PLUG_IN_PROC, "Repaint the selection with the Infill engine",
      "Sends the active layer and the selection (as the mask: unselected pixels are kept, "
      "selected ones regenerated, partly selected ones blended) to a running infill-engine and "
      "adds the result as a new layer above the active one. Needs a running engine "
      "(infill-engine, or the Infill editor, which starts one).",
      "The Infill developers", "The Infill developers", "2026", "Repaint _selection...",
      "RGB*, GRAY*", GIMP_PLUGIN, G_N_ELEMENTS(args), G_N_ELEMENTS(return_vals), args, return_vals);
  gimp_plugin_menu_register(PLUG_IN_PROC, "<Image>/Filters/Infill");
}

/* ---------------------------------------------------------------------------------------- */
/* Errors                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Frees `e` and returns "<what>: <SDK message>" (g_free it). */
static gchar* take_error(const char* what, infill_error* e) {
  gchar* text = g_strdup_printf("%s: %s", what, infill_error_message(e));
  infill_error_delete(e);
  return text;
}

/* ---------------------------------------------------------------------------------------- */
/* Engine connection                                                                        */
/* ---------------------------------------------------------------------------------------- */

static infill_error* connect_client(const RepaintValues* v, uint32_t connect_timeout_ms,
                                    infill_client** out) {
  infill_client_options options;
  infill_client_options_init(&options);
  options.endpoint = v->endpoint[0] ? v->endpoint : NULL;
  options.token_file = v->token_file[0] ? v->token_file : NULL;
  options.connect_timeout_ms = connect_timeout_ms;
  return infill_client_create(&options, out);
}

/* Connects and waits until the engine is ready; on failure returns a message (g_free it). */
static gchar* open_engine(const RepaintValues* v, infill_client** out) {
  infill_client* client = NULL;
  infill_health health;
  infill_error* e;
  gchar* msg;

  *out = NULL;
  if (infill_api_version() >> 16 != INFILL_CLIENT_API_VERSION_MAJOR)
    return g_strdup_printf("libinfill_client %s has an incompatible API (the plug-in needs %d.x)",
                           infill_library_version(), INFILL_CLIENT_API_VERSION_MAJOR);
  e = connect_client(v, 0, &client);
  if (e) return take_error("bad engine settings", e);

  infill_health_init(&health);
  e = infill_client_health(client, &health);
  if (e) {
    /* The SDK's message names the endpoint and suggests starting the engine. */
    msg =
        g_strdup_printf("cannot reach the Infill engine (%s): %s",
                        infill_error_code_name(infill_error_get_code(e)), infill_error_message(e));
    infill_error_delete(e);
    infill_client_destroy(client);
    return msg;
  }
  if (!health.ready) {
    gimp_progress_set_text("Infill: waiting for the engine to load its model");
    e = infill_client_wait_ready(client, 120000);
    if (e) {
      infill_client_destroy(client);
      return take_error("the Infill engine did not become ready", e);
    }
  }
  *out = client;
  return NULL;
}

/* Whether the model reads free text (a text encoder) rather than words of a vocabulary. The
 * field exists from SDK 1.1 on: an older library's struct is shorter. */
static int model_free_text(const infill_model_info* model) {
  return model && model->struct_size >= offsetof(infill_model_info, free_text) + sizeof(model->free_text) &&
         model->free_text;
}

/* Checks `prompt` against the model's vocabulary; NULL when fine, when the model reads free
 * text or when the model list is not available (the engine checks again), else a message
 * naming the unknown words. */
static gchar* check_prompt(const infill_model_info* model, const char* prompt) {
  /* Words as the engine splits them: at ASCII white space and commas, compared in lower case. */
  gchar** words;
  GString* unknown;
  gchar* msg = NULL;
  size_t i, k, count = 0;

  if (!model || !prompt || model_free_text(model)) return NULL;
  words = g_strsplit_set(prompt, " \t\n\v\f\r,", -1);
  unknown = g_string_new(NULL);
  for (i = 0; words[i]; ++i) {
    gchar* word = g_ascii_strdown(words[i], -1);
    int found = 0;
    if (word[0]) {
      ++count;
      for (k = 0; k < model->vocabulary_count && !found; ++k)
        found = strcmp(word, model->vocabulary[k]) == 0;
      if (!found) g_string_append_printf(unknown, "%s'%s'", unknown->len ? ", " : "", word);
    }
    g_free(word);
  }
  if (count > 0 && model->vocabulary_count == 0)
    msg = g_strdup_printf("the model %s takes no prompt; leave the prompt empty", model->name);
  else if (unknown->len)
    msg = g_strdup_printf("the prompt uses words the model %s does not know: %s", model->name,
                          unknown->str);
  g_string_free(unknown, TRUE);
  g_strfreev(words);
  return msg;
}

/* ---------------------------------------------------------------------------------------- */
/* The cancel watcher                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* Cancels the edit on the engine through the SDK (infill_client_cancel_edit), with the token
 * file the plug-in used, so that auth, timeouts and errors behave as in every other call. */
static int send_cancel(const char* endpoint, const char* edit_id, const char* token_file) {
  infill_client_options o;
  infill_client* client = NULL;
  infill_error* e;
  guint64 id = g_ascii_strtoull(edit_id, NULL, 10);

  infill_client_options_init(&o);
  o.endpoint = endpoint;
  o.token_file = token_file && *token_file ? token_file : NULL;
  o.connect_timeout_ms = 5000;
  o.request_timeout_ms = 5000;
  o.cancel_on_destroy = 0;
  e = infill_client_create(&o, &client);
  if (!e) e = infill_client_cancel_edit(client, id);
  if (e) {
    g_printerr("infill-repaint: cancelling edit %s at %s: %s\n", edit_id, endpoint, infill_error_message(e));
    infill_error_delete(e);
  }
  if (client) infill_client_destroy(client);
  return e ? 1 : 0;
}

/* infill-repaint --cancel-watch ENDPOINT EDIT_ID [TOKEN_FILE]: waits for stdin to close; cancels
 * the edit unless the plug-in wrote "done" first. */
static int cancel_watch_main(int argc, char** argv) {
  char buffer[64];
  size_t n, total = 0;
  char seen[8] = "";
  if (argc < 4) return 2;
  while ((n = fread(buffer, 1, sizeof buffer, stdin)) > 0) {
    /* Only the last few bytes matter: "done" is the plug-in's final word. */
    for (size_t i = 0; i < n; ++i) {
      memmove(seen, seen + 1, sizeof seen - 2);
      seen[sizeof seen - 2] = buffer[i];
    }
    total += n;
  }
  if (total >= 4 && strstr(seen, "done")) return 0;
  return send_cancel(argv[2], argv[3], argc > 4 ? argv[4] : NULL);
}

/* Starts the watcher for `edit_id`; returns the write end of its stdin, or -1. */
static int start_cancel_watch(const char* endpoint, uint64_t edit_id, const char* token_file) {
  gchar id_text[32];
  gchar* argv[6];
  gint fd = -1;
  GError* error = NULL;
  if (!g_self_path) return -1;
  g_snprintf(id_text, sizeof id_text, "%" G_GUINT64_FORMAT, (guint64)edit_id);
  argv[0] = (gchar*)g_self_path;
  argv[1] = (gchar*)CANCEL_WATCH_ARG;
  argv[2] = (gchar*)endpoint;
  argv[3] = id_text;
  argv[4] = (gchar*)(token_file ? token_file : "");
  argv[5] = NULL;
  /* g_spawn closes every other descriptor in the child: it does not hold GIMP's pipes. */
  if (!g_spawn_async_with_pipes(NULL, argv, NULL, G_SPAWN_STDOUT_TO_DEV_NULL, NULL, NULL, NULL, &fd,
                                NULL, NULL, &error)) {
    g_printerr("infill-repaint: no cancel watcher: %s\n", error->message);
    g_clear_error(&error);
    return -1;
  }
  return fd;
}

static void stop_cancel_watch(int fd) {
  if (fd < 0) return;
  if (write(fd, "done", 4) != 4) { /* the watcher is gone: nothing to stop */
  }
  close(fd);
}

/* ---------------------------------------------------------------------------------------- */
/* Pixels                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* The 8-bit formats the layer is read and written in; RGB images keep their colour space. */
static const Babl* pixel_format(gint32 drawable, gboolean alpha) {
  const char* name = alpha ? "R'G'B'A u8" : "R'G'B' u8";
  if (gimp_drawable_is_rgb(drawable))
    return babl_format_with_space(name, gimp_drawable_get_format(drawable));
  return babl_format(name);
}

/* The layer's pixels as PNG; NULL and *error set on failure. */
static gchar* encode_layer(gint32 drawable, gint w, gint h, gsize* png_size, gchar** error) {
  gboolean alpha = gimp_drawable_has_alpha(drawable);
  gint bpp = alpha ? 4 : 3;
  guchar* pixels = g_try_malloc((gsize)w * h * bpp);
  GeglBuffer* buffer;
  GdkPixbuf* pixbuf;
  gchar* png = NULL;
  GError* gerror = NULL;

  if (!pixels) {
    *error = g_strdup_printf("out of memory reading the %dx%d layer", w, h);
    return NULL;
  }
  buffer = gimp_drawable_get_buffer(drawable);
  gegl_buffer_get(buffer, GEGL_RECTANGLE(0, 0, w, h), 1.0, pixel_format(drawable, alpha), pixels,
                  GEGL_AUTO_ROWSTRIDE, GEGL_ABYSS_NONE);
  g_object_unref(buffer);
  pixbuf =
      gdk_pixbuf_new_from_data(pixels, GDK_COLORSPACE_RGB, alpha, 8, w, h, w * bpp, NULL, NULL);
  /* Fast compression: the engine decodes it once, on the same machine most of the time. */
  if (!gdk_pixbuf_save_to_buffer(pixbuf, &png, png_size, "png", &gerror, "compression", "1",
                                 NULL)) {
    *error = g_strdup_printf("encoding the layer as PNG: %s", gerror->message);
    g_clear_error(&gerror);
    png = NULL;
  }
  g_object_unref(pixbuf);
  g_free(pixels);
  return png;
}

/* How deep a layer's pixels travel to the engine: 8-bit images as 8-bit PNG, 16-bit integer ones
 * as 16-bit TIFF, the rest (32-bit integer, half, float, double) as float TIFF, all perceptual
 * (R'G'B'), which the engine reads as display-referred whatever the image's linear or gamma
 * storage. */
typedef enum { DEPTH_U8, DEPTH_U16, DEPTH_FLOAT } LayerDepth;

static LayerDepth layer_depth(gint32 image) {
  switch (gimp_image_get_precision(image)) {
    case GIMP_PRECISION_U8_LINEAR:
    case GIMP_PRECISION_U8_GAMMA:
      return DEPTH_U8;
    case GIMP_PRECISION_U16_LINEAR:
    case GIMP_PRECISION_U16_GAMMA:
      return DEPTH_U16;
    default:
      return DEPTH_FLOAT;
  }
}

static const Babl* deep_format(gint32 drawable, gboolean alpha, LayerDepth depth) {
  const char* name = depth == DEPTH_U16 ? (alpha ? "R'G'B'A u16" : "R'G'B' u16")
                                        : (alpha ? "R'G'B'A float" : "R'G'B' float");
  if (gimp_drawable_is_rgb(drawable)) return babl_format_with_space(name, gimp_drawable_get_format(drawable));
  return babl_format(name);
}

/* A private temporary file name ending in `suffix`; g_free it and unlink the file. */
static gchar* temp_path(const char* suffix, gchar** error) {
  GError* gerror = NULL;
  gchar* path = NULL;
  gchar* pattern = g_strconcat("infill-XXXXXX", suffix, NULL);
  int fd = g_file_open_tmp(pattern, &path, &gerror);
  g_free(pattern);
  if (fd < 0) {
    *error = g_strdup_printf("cannot create a temporary file: %s", gerror->message);
    g_clear_error(&gerror);
    return NULL;
  }
  close(fd);
  return path;
}

/* The layer's pixels as a 16-bit or float TIFF; NULL and *error set on failure. */
static gchar* encode_deep_layer(gint32 drawable, gint w, gint h, LayerDepth depth, gsize* size, gchar** error) {
  gboolean alpha = gimp_drawable_has_alpha(drawable);
  TiffPixels p = {w, h, alpha ? 4 : 3, depth == DEPTH_FLOAT, NULL};
  gsize bytes = (gsize)w * h * p.channels * (p.is_float ? 4 : 2);
  GeglBuffer* buffer;
  gchar* path;
  gchar* data = NULL;
  GError* gerror = NULL;

  p.data = g_try_malloc(bytes);
  if (!p.data) {
    *error = g_strdup_printf("out of memory reading the %dx%d layer", w, h);
    return NULL;
  }
  buffer = gimp_drawable_get_buffer(drawable);
  gegl_buffer_get(buffer, GEGL_RECTANGLE(0, 0, w, h), 1.0, deep_format(drawable, alpha, depth), p.data,
                  GEGL_AUTO_ROWSTRIDE, GEGL_ABYSS_NONE);
  g_object_unref(buffer);
  path = temp_path(".tif", error);
  if (path) {
    *error = tiff_pixels_write(path, &p);
    if (!*error && !g_file_get_contents(path, &data, size, &gerror)) {
      *error = g_strdup_printf("reading back the layer's TIFF: %s", gerror->message);
      g_clear_error(&gerror);
    }
    unlink(path);
    g_free(path);
  }
  g_free(p.data);
  return *error ? (g_free(data), NULL) : data;
}

/* The engine's 16-bit or float TIFF result as a new layer above `drawable`: a copy of the layer
 * whose pixels inside the selection (`mask` > 0, layer coordinates) are the result's, so every
 * pixel outside it keeps the layer's own bytes at the image's precision. */
static gint32 add_deep_result_layer(gint32 image, gint32 drawable, const guchar* mask, LayerDepth depth,
                                    const void* file, size_t file_size, const char* prompt, gchar** error) {
  gint w = gimp_drawable_width(drawable), h = gimp_drawable_height(drawable);
  gboolean alpha = gimp_drawable_has_alpha(drawable);
  TiffPixels r = {0, 0, 0, FALSE, NULL};
  GError* gerror = NULL;
  gchar* path = temp_path(".tif", error);
  gint32 layer = -1;
  gint ox, oy, x, y;
  gsize pixel_bytes;
  gchar* name;
  GeglBuffer* buffer;
  const Babl* format = deep_format(drawable, alpha, depth);

  if (!path) return -1;
  if (!g_file_set_contents(path, file, (gssize)file_size, &gerror)) {
    *error = g_strdup_printf("writing the engine's result to %s: %s", path, gerror->message);
    g_clear_error(&gerror);
  } else {
    *error = tiff_pixels_read(path, &r);
  }
  unlink(path);
  g_free(path);
  if (*error) return -1;
  if (r.width != w || r.height != h || r.channels != (alpha ? 4 : 3) || r.is_float != (depth == DEPTH_FLOAT)) {
    *error = g_strdup_printf("the engine's result is %dx%d with %d %s channels, the layer %dx%d with %d %s channels",
                             r.width, r.height, r.channels, r.is_float ? "float" : "16-bit", w, h, alpha ? 4 : 3,
                             depth == DEPTH_FLOAT ? "float" : "16-bit");
    g_free(r.data);
    return -1;
  }
  pixel_bytes = (gsize)r.channels * (r.is_float ? 4 : 2);
  gimp_drawable_offsets(drawable, &ox, &oy);
  name = prompt && prompt[0] ? g_strdup_printf("Infill: %s", prompt) : g_strdup("Infill");
  gimp_image_undo_group_start(image);
  layer = gimp_layer_copy(drawable);
  if (layer != -1 && gimp_image_insert_layer(image, layer, gimp_item_get_parent(drawable),
                                             gimp_image_get_item_position(image, drawable))) {
    gimp_item_set_name(layer, name);
    gimp_layer_set_offsets(layer, ox, oy);
    buffer = gimp_drawable_get_buffer(layer);
    for (y = 0; y < h; ++y) {
      for (x = 0; x < w;) {
        gint start;
        if (!mask[(gsize)y * w + x]) {
          ++x;
          continue;
        }
        for (start = x; x < w && mask[(gsize)y * w + x]; ++x) {
        }
        gegl_buffer_set(buffer, GEGL_RECTANGLE(start, y, x - start, 1), 0, format,
                        r.data + ((gsize)y * w + start) * pixel_bytes, GEGL_AUTO_ROWSTRIDE);
      }
    }
    g_object_unref(buffer); /* flushes the tiles to GIMP */
    gimp_drawable_update(layer, 0, 0, w, h);
  } else {
    *error = g_strdup("GIMP refused the new layer");
    layer = -1;
  }
  gimp_image_undo_group_end(image);
  g_free(name);
  g_free(r.data);
  return layer;
}

/* The selection under the layer (w x h at the layer's offsets) as 8-bit grey: 0 = keep,
 * 255 = regenerate. Sets *any to whether a pixel is selected. */
static guchar* read_mask(gint32 image, gint ox, gint oy, gint w, gint h, gboolean* any) {
  guchar* mask = g_try_malloc((gsize)w * h);
  GeglBuffer* buffer;
  gsize i;
  if (!mask) return NULL;
  buffer = gimp_drawable_get_buffer(gimp_image_get_selection(image));
  /* Outside the image (a layer larger than the canvas) nothing is selected: the abyss is 0. */
  gegl_buffer_get(buffer, GEGL_RECTANGLE(ox, oy, w, h), 1.0, babl_format("Y u8"), mask,
                  GEGL_AUTO_ROWSTRIDE, GEGL_ABYSS_NONE);
  g_object_unref(buffer);
  *any = FALSE;
  for (i = 0; i < (gsize)w * h && !*any; ++i) *any = mask[i] != 0;
  return mask;
}

/* Decodes the result PNG into a new layer above `drawable`; returns its id or -1. */
static gint32 add_result_layer(gint32 image, gint32 drawable, const void* png, size_t png_size,
                               const char* prompt, gchar** error) {
  GdkPixbufLoader* loader = gdk_pixbuf_loader_new_with_type("png", NULL);
  GError* gerror = NULL;
  GdkPixbuf* pixbuf = NULL;
  gint w = gimp_drawable_width(drawable), h = gimp_drawable_height(drawable);
  gint ox, oy, pw, ph;
  gint32 layer = -1;
  gchar* name;
  GeglBuffer* buffer;

  if (gdk_pixbuf_loader_write(loader, png, png_size, &gerror) &&
      gdk_pixbuf_loader_close(loader, &gerror))
    pixbuf = gdk_pixbuf_loader_get_pixbuf(loader);
  else
    gdk_pixbuf_loader_close(loader, NULL);
  if (!pixbuf) {
    *error = g_strdup_printf("the engine's result (%lu bytes) is not a PNG: %s",
                             (unsigned long)png_size, gerror ? gerror->message : "no image");
    g_clear_error(&gerror);
    g_object_unref(loader);
    return -1;
  }
  pw = gdk_pixbuf_get_width(pixbuf);
  ph = gdk_pixbuf_get_height(pixbuf);
  if (pw != w || ph != h || gdk_pixbuf_get_bits_per_sample(pixbuf) != 8 ||
      gdk_pixbuf_get_n_channels(pixbuf) < 3) {
    *error = g_strdup_printf("the engine's result is %dx%d with %d channels, the layer is %dx%d",
                             pw, ph, gdk_pixbuf_get_n_channels(pixbuf), w, h);
    g_object_unref(loader);
    return -1;
  }

  gimp_drawable_offsets(drawable, &ox, &oy);
  name = prompt && prompt[0] ? g_strdup_printf("Infill: %s", prompt) : g_strdup("Infill");
  gimp_image_undo_group_start(image);
  layer = gimp_layer_new(image, name, w, h, gimp_drawable_type(drawable), 100.0,
                         GIMP_LAYER_MODE_NORMAL);
  g_free(name);
  if (layer != -1 && gimp_image_insert_layer(image, layer, gimp_item_get_parent(drawable),
                                             gimp_image_get_item_position(image, drawable))) {
    gimp_layer_set_offsets(layer, ox, oy);
    buffer = gimp_drawable_get_buffer(layer);
    gegl_buffer_set(buffer, GEGL_RECTANGLE(0, 0, w, h), 0,
                    pixel_format(drawable, gdk_pixbuf_get_has_alpha(pixbuf)),
                    gdk_pixbuf_get_pixels(pixbuf), gdk_pixbuf_get_rowstride(pixbuf));
    g_object_unref(buffer); /* flushes the tiles to GIMP */
    gimp_drawable_update(layer, 0, 0, w, h);
  } else {
    *error = g_strdup("GIMP refused the new layer");
    layer = -1;
  }
  gimp_image_undo_group_end(image);
  g_object_unref(loader);
  return layer;
}

/* ---------------------------------------------------------------------------------------- */
/* The repaint                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* Repaints the selection of `drawable`; returns the new layer or -1 with *error set. */
static gint32 repaint(gint32 image, gint32 drawable, const RepaintValues* v, gchar** error) {
  infill_client* client = NULL;
  infill_model_list* models = NULL;
  infill_template_info tmpl;
  infill_edit_params params;
  infill_adapter_info adapter_info;
  infill_edit_adapter adapter;
  infill_job* job = NULL;
  infill_error* e = NULL;
  gint w, h, ox, oy;
  gboolean any = FALSE;
  guchar* mask = NULL;
  gchar* png = NULL;
  gsize png_size = 0;
  gint32 layer = -1;
  int watch_fd = -1;
  guint64 seed;
  LayerDepth depth = DEPTH_U8;

  *error = NULL;
  if (!gimp_item_is_layer(drawable)) {
    *error = g_strdup("the active drawable is not a layer: select the layer to repaint");
    return -1;
  }
  if (gimp_selection_is_empty(image)) {
    *error = g_strdup("select the region to repaint first (the selection is empty)");
    return -1;
  }
  w = gimp_drawable_width(drawable);
  h = gimp_drawable_height(drawable);
  gimp_drawable_offsets(drawable, &ox, &oy);
  mask = read_mask(image, ox, oy, w, h, &any);
  if (!mask) {
    *error = g_strdup_printf("out of memory reading the %dx%d selection", w, h);
    return -1;
  }
  if (!any) {
    *error =
        g_strdup_printf("the selection does not touch the layer '%s': select a region inside it",
                        gimp_item_get_name(drawable));
    g_free(mask);
    return -1;
  }

  gimp_progress_init("Infill: connecting to the engine");
  *error = open_engine(v, &client);
  if (*error) goto out;

  e = infill_client_list_models(client, &models);
  if (e) {
    *error = take_error("listing the engine's models", e);
    goto out;
  }
  *error = check_prompt(infill_model_list_get(models, 0), v->prompt);
  if (*error) goto out;

  gimp_progress_set_text("Infill: uploading the layer");
  depth = layer_depth(image);
  png = depth == DEPTH_U8 ? encode_layer(drawable, w, h, &png_size, error)
                          : encode_deep_layer(drawable, w, h, depth, &png_size, error);
  if (!png) goto out;
  infill_template_info_init(&tmpl);
  e = infill_client_upload_template(client, png, png_size, gimp_item_get_name(drawable), &tmpl);
  if (e) {
    *error = take_error("uploading the layer", e);
    goto out;
  }

  seed = v->seed >= 0 && !v->random_seed ? (guint64)v->seed : (guint64)g_random_int();
  infill_edit_params_init(&params);
  if (v->adapter_file[0]) {
    /* The same file again is the same adapter on the engine (its id is the bytes' SHA-256):
     * uploading it on every run costs a read, not a copy in the store. */
    gimp_progress_set_text("Infill: uploading the LoRA");
    infill_adapter_info_init(&adapter_info);
    e = infill_client_upload_adapter_file(client, v->adapter_file, NULL, &adapter_info);
    if (e) {
      *error = take_error("the LoRA was not accepted", e);
      goto out;
    }
    infill_edit_adapter_init(&adapter);
    adapter.id = adapter_info.id;
    adapter.strength = v->adapter_strength;
    params.adapters = &adapter;
    params.adapter_count = 1;
  }
  params.template_id = tmpl.id;
  params.mask_pixels = mask;
  params.mask_width = (uint32_t)w;
  params.mask_height = (uint32_t)h;
  params.prompt = v->prompt;
  params.seed = seed;
  params.steps = v->steps > 0 ? (uint32_t)v->steps : 0;
  params.strength = v->strength;
  params.guidance = v->guidance;
  /* Someone waits at GIMP, but a large layer on a CPU takes longer than the interactive
   * class's 5 s: keep its priority and allow ten minutes. */
  params.edit_class = INFILL_CLASS_INTERACTIVE;
  params.deadline_ms = 600000.0;
  /* Deeper layers come back as TIFF at the depth they were sent (API 1.2). */
  params.output_format = depth == DEPTH_U8 ? "png" : "tiff";
  e = infill_client_submit_edit(client, &params, &job);
  if (e) {
    *error = take_error("the engine refused the edit", e);
    goto out;
  }
  watch_fd = start_cancel_watch(infill_client_endpoint(client), infill_job_id(job), v->token_file);

  gimp_progress_set_text_printf("Infill: repainting (%s template)",
                                tmpl.state == INFILL_TEMPLATE_PREPARED ? "cached" : "new");
  for (;;) {
    uint32_t done = 0, total = 0;
    e = infill_job_wait(job, 100);
    if (!e) break;
    if (infill_error_get_code(e) != INFILL_ERROR_TIMEOUT) {
      *error = take_error("waiting for the edit", e);
      goto out;
    }
    infill_error_delete(e);
    infill_job_progress(job, &done, &total);
    if (total > 0)
      gimp_progress_update((gdouble)done / total);
    else
      gimp_progress_pulse(); /* queued, or waiting for the template's prepare job */
  }
  stop_cancel_watch(watch_fd);
  watch_fd = -1;

  if (infill_job_get_state(job) != INFILL_JOB_DONE) {
    const infill_error* why = infill_job_error(job);
    *error = g_strdup_printf("the edit %s: %s", infill_job_state_name(infill_job_get_state(job)),
                             why ? infill_error_message(why) : "no reason given");
    goto out;
  } else {
    const void* result = NULL;
    size_t result_size = 0;
    e = infill_job_result(job, &result, &result_size);
    if (e) {
      *error = take_error("reading the result", e);
      goto out;
    }
    gimp_progress_set_text("Infill: adding the result layer");
    layer = depth == DEPTH_U8 ? add_result_layer(image, drawable, result, result_size, v->prompt, error)
                              : add_deep_result_layer(image, drawable, mask, depth, result, result_size, v->prompt, error);
  }
  gimp_progress_update(1.0);

out:
  stop_cancel_watch(watch_fd);
  infill_job_release(job);
  infill_model_list_delete(models);
  infill_client_destroy(client);
  g_free(png);
  g_free(mask);
  gimp_progress_end();
  return layer;
}

/* ---------------------------------------------------------------------------------------- */
/* The dialog                                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
  GtkWidget* prompt;
  GtkWidget* adapter_file;
  GtkWidget* endpoint;
  GtkWidget* status;
  GtkWidget* steps_hint;
  GtkWidget* guidance_hint;
  infill_model_list* models;
  gchar* model_text; /* what the status label says about the engine's model */
} DialogState;

/* Describes the model behind the endpoint (its vocabulary) in the dialog. */
static void show_model(DialogState* s, const RepaintValues* v) {
  infill_client* client = NULL;
  infill_error* e;
  gchar* text;
  const infill_model_info* m;

  infill_model_list_delete(s->models);
  s->models = NULL;
  e = connect_client(v, 2000, &client);
  if (!e) e = infill_client_list_models(client, &s->models);
  if (e) {
    /* The SDK's message names the endpoint. */
    text = g_strdup_printf("Engine not reachable: %s", infill_error_message(e));
    infill_error_delete(e);
  } else if (!(m = infill_model_list_get(s->models, 0))) {
    text = g_strdup("The engine serves no model.");
  } else if (model_free_text(m)) {
    text = g_strdup_printf("Model %s (%u steps by default). Describe the change in your own words.", m->name,
                           (unsigned)m->default_steps);
  } else if (m->vocabulary_count == 0) {
    text = g_strdup_printf("Model %s (%u steps by default) takes no prompt.", m->name,
                           (unsigned)m->default_steps);
  } else {
    GString* words = g_string_new(NULL);
    size_t i;
    for (i = 0; i < m->vocabulary_count; ++i)
      g_string_append_printf(words, "%s%s", i ? " " : "", m->vocabulary[i]);
    text = g_strdup_printf("Model %s (%u steps by default). Prompt words: %s", m->name,
                           (unsigned)m->default_steps, words->str);
    g_string_free(words, TRUE);
  }
  gtk_label_set_text(GTK_LABEL(s->status), text);
  g_free(s->model_text);
  s->model_text = text;
  if ((m = infill_model_list_get(s->models, 0))) {
    text = g_strdup_printf("0 = the model's %u", (unsigned)m->default_steps);
    gtk_label_set_text(GTK_LABEL(s->steps_hint), text);
    g_free(text);
    text = g_strdup_printf("0 = the model's %.1f", m->default_guidance);
    gtk_label_set_text(GTK_LABEL(s->guidance_hint), text);
    g_free(text);
  } else {
    gtk_label_set_text(GTK_LABEL(s->steps_hint), "0 = the model's default");
    gtk_label_set_text(GTK_LABEL(s->guidance_hint), "0 = the model's default");
  }
  infill_client_destroy(client);
}

/* A grey hint right of a spin button in `row` of the dialog's table. */
static GtkWidget* attach_hint(GtkWidget* table, int row) {
  GtkWidget* label = gtk_label_new(NULL);
  gtk_misc_set_alignment(GTK_MISC(label), 0.0, 0.5);
  gimp_label_set_attributes(GTK_LABEL(label), PANGO_ATTR_STYLE, PANGO_STYLE_ITALIC, -1);
  gtk_table_attach(GTK_TABLE(table), label, 2, 3, row, row + 1, GTK_FILL, GTK_FILL, 0, 0);
  return label;
}

static void on_int_changed(GtkAdjustment* adj, gint32* value) {
  *value = (gint32)gtk_adjustment_get_value(adj);
}
static void on_double_changed(GtkAdjustment* adj, gdouble* value) {
  *value = gtk_adjustment_get_value(adj);
}

/* Browse... next to the LoRA entry: a file chooser for .safetensors files. */
static void on_browse_adapter(GtkWidget* button, GtkWidget* entry) {
  GtkWidget* chooser = gtk_file_chooser_dialog_new("Choose a LoRA", GTK_WINDOW(gtk_widget_get_toplevel(button)),
                                                   GTK_FILE_CHOOSER_ACTION_OPEN, "_Cancel", GTK_RESPONSE_CANCEL,
                                                   "_Open", GTK_RESPONSE_ACCEPT, NULL);
  GtkFileFilter* filter = gtk_file_filter_new();
  gtk_file_filter_set_name(filter, "LoRA (*.safetensors)");
  gtk_file_filter_add_pattern(filter, "*.safetensors");
  gtk_file_chooser_add_filter(GTK_FILE_CHOOSER(chooser), filter);
  if (gtk_entry_get_text(GTK_ENTRY(entry))[0])
    gtk_file_chooser_set_filename(GTK_FILE_CHOOSER(chooser), gtk_entry_get_text(GTK_ENTRY(entry)));
  if (gtk_dialog_run(GTK_DIALOG(chooser)) == GTK_RESPONSE_ACCEPT) {
    gchar* path = gtk_file_chooser_get_filename(GTK_FILE_CHOOSER(chooser));
    gtk_entry_set_text(GTK_ENTRY(entry), path ? path : "");
    g_free(path);
  }
  gtk_widget_destroy(chooser);
}

static gboolean repaint_dialog(RepaintValues* v) {
  GtkWidget *dialog, *vbox, *table, *seed_box, *steps_spin, *guidance_spin, *token_entry, *adapter_box, *browse;
  GtkObject *steps_adj, *strength_adj, *guidance_adj, *adapter_strength_adj;
  DialogState s = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
  guint32 seed = v->seed >= 0 ? (guint32)v->seed : 0;
  gboolean random_seed = v->random_seed || v->seed < 0;
  gboolean ok = FALSE;
  gchar default_endpoint[512];
  gchar* tip;

  gimp_ui_init(PLUG_IN_BINARY, FALSE);
  dialog =
      gimp_dialog_new("Infill: Repaint selection", PLUG_IN_ROLE, NULL, 0, gimp_standard_help_func,
                      PLUG_IN_PROC, "_Cancel", GTK_RESPONSE_CANCEL, "_OK", GTK_RESPONSE_OK, NULL);
  gtk_dialog_set_alternative_button_order(GTK_DIALOG(dialog), GTK_RESPONSE_OK, GTK_RESPONSE_CANCEL,
                                          -1);
  gimp_window_set_transient(GTK_WINDOW(dialog));

  vbox = gtk_vbox_new(FALSE, 12);
  gtk_container_set_border_width(GTK_CONTAINER(vbox), 12);
  gtk_box_pack_start(GTK_BOX(gtk_dialog_get_content_area(GTK_DIALOG(dialog))), vbox, TRUE, TRUE, 0);

  table = gtk_table_new(9, 3, FALSE);
  gtk_table_set_col_spacings(GTK_TABLE(table), 6);
  gtk_table_set_row_spacings(GTK_TABLE(table), 6);
  gtk_box_pack_start(GTK_BOX(vbox), table, FALSE, FALSE, 0);

  s.prompt = gtk_entry_new();
  gtk_entry_set_text(GTK_ENTRY(s.prompt), v->prompt);
  gtk_entry_set_activates_default(GTK_ENTRY(s.prompt), TRUE);
  gimp_table_attach_aligned(GTK_TABLE(table), 0, 0, "_Prompt:", 0.0, 0.5, s.prompt, 2, FALSE);

  seed_box = gimp_random_seed_new(&seed, &random_seed);
  gimp_table_attach_aligned(GTK_TABLE(table), 0, 1, "_Seed:", 0.0, 0.5, seed_box, 2, TRUE);

  steps_adj = gtk_adjustment_new(v->steps, 0, 1000, 1, 10, 0);
  steps_spin = gtk_spin_button_new(GTK_ADJUSTMENT(steps_adj), 1, 0);
  gimp_help_set_help_data(steps_spin, "0 = the model's default", NULL);
  gimp_table_attach_aligned(GTK_TABLE(table), 0, 2, "S_teps:", 0.0, 0.5, steps_spin, 1, TRUE);
  s.steps_hint = attach_hint(table, 2);
  g_signal_connect(steps_adj, "value-changed", G_CALLBACK(on_int_changed), &v->steps);

  strength_adj = gimp_scale_entry_new(GTK_TABLE(table), 0, 3, "St_rength:", 150, 6,
                                      v->strength > 0 ? v->strength : 1.0, 0.01, 1.0, 0.01, 0.1, 2,
                                      TRUE, 0, 0, "How much the selection may change", NULL);
  g_signal_connect(strength_adj, "value-changed", G_CALLBACK(on_double_changed), &v->strength);

  guidance_adj = gtk_adjustment_new(v->guidance, 0, 20, 0.5, 1, 0);
  guidance_spin = gtk_spin_button_new(GTK_ADJUSTMENT(guidance_adj), 1, 1);
  gimp_help_set_help_data(guidance_spin,
                          "How closely to follow the prompt, 1..20; 0 = the model's default", NULL);
  gimp_table_attach_aligned(GTK_TABLE(table), 0, 4, "_Guidance:", 0.0, 0.5, guidance_spin, 1, TRUE);
  s.guidance_hint = attach_hint(table, 4);
  g_signal_connect(guidance_adj, "value-changed", G_CALLBACK(on_double_changed), &v->guidance);

  /* The LoRA: a file (empty = none) and its strength. */
  adapter_box = gtk_hbox_new(FALSE, 6);
  s.adapter_file = gtk_entry_new();
  gtk_entry_set_text(GTK_ENTRY(s.adapter_file), v->adapter_file);
  gimp_help_set_help_data(s.adapter_file,
                          "A LoRA (.safetensors) for FLUX.2 models, uploaded to the engine and applied to the "
                          "edit; empty = none",
                          NULL);
  browse = gtk_button_new_with_mnemonic("_Browse...");
  g_signal_connect(browse, "clicked", G_CALLBACK(on_browse_adapter), s.adapter_file);
  gtk_box_pack_start(GTK_BOX(adapter_box), s.adapter_file, TRUE, TRUE, 0);
  gtk_box_pack_start(GTK_BOX(adapter_box), browse, FALSE, FALSE, 0);
  gimp_table_attach_aligned(GTK_TABLE(table), 0, 5, "_LoRA:", 0.0, 0.5, adapter_box, 2, FALSE);
  adapter_strength_adj = gimp_scale_entry_new(GTK_TABLE(table), 0, 6, "LoRA stre_ngth:", 150, 6, v->adapter_strength,
                                              kAdapterStrengthMin, kAdapterStrengthMax, 0.05, 0.5, 2, TRUE, 0, 0,
                                              "How strongly the LoRA applies; 1 = as trained, 0 = not at all", NULL);
  g_signal_connect(adapter_strength_adj, "value-changed", G_CALLBACK(on_double_changed), &v->adapter_strength);

  s.endpoint = gtk_entry_new();
  gtk_entry_set_text(GTK_ENTRY(s.endpoint), v->endpoint);
  infill_default_endpoint(default_endpoint, sizeof default_endpoint);
  tip = g_strdup_printf("unix:/path/engine.sock or http://HOST:PORT; empty = %s", default_endpoint);
  gimp_help_set_help_data(s.endpoint, tip, NULL);
  g_free(tip);
  gimp_table_attach_aligned(GTK_TABLE(table), 0, 7, "_Engine:", 0.0, 0.5, s.endpoint, 2, FALSE);

  token_entry = gtk_entry_new();
  gtk_entry_set_text(GTK_ENTRY(token_entry), v->token_file);
  gimp_help_set_help_data(
      token_entry, "For http:// engines; empty = $INFILL_TOKEN or ~/.config/infill/token", NULL);
  gimp_table_attach_aligned(GTK_TABLE(table), 0, 8, "Token _file:", 0.0, 0.5, token_entry, 2,
                            FALSE);

  s.status = gtk_label_new(NULL);
  gtk_label_set_line_wrap(GTK_LABEL(s.status), TRUE);
  gtk_label_set_selectable(GTK_LABEL(s.status), TRUE);
  gtk_widget_set_size_request(s.status, 360, -1);
  gtk_misc_set_alignment(GTK_MISC(s.status), 0.0, 0.5);
  gtk_box_pack_start(GTK_BOX(vbox), s.status, FALSE, FALSE, 0);

  gtk_dialog_set_default_response(GTK_DIALOG(dialog), GTK_RESPONSE_OK);
  gtk_widget_show_all(dialog);
  gtk_widget_grab_focus(s.prompt);
  show_model(&s, v);

  for (;;) {
    gchar* problem;
    gboolean endpoint_changed;
    if (gimp_dialog_run(GIMP_DIALOG(dialog)) != GTK_RESPONSE_OK) break;
    g_strlcpy(v->prompt, gtk_entry_get_text(GTK_ENTRY(s.prompt)), sizeof v->prompt);
    endpoint_changed = strcmp(v->endpoint, gtk_entry_get_text(GTK_ENTRY(s.endpoint))) != 0 ||
                       strcmp(v->token_file, gtk_entry_get_text(GTK_ENTRY(token_entry))) != 0;
    g_strlcpy(v->endpoint, gtk_entry_get_text(GTK_ENTRY(s.endpoint)), sizeof v->endpoint);
    g_strlcpy(v->token_file, gtk_entry_get_text(GTK_ENTRY(token_entry)), sizeof v->token_file);
    g_strlcpy(v->adapter_file, gtk_entry_get_text(GTK_ENTRY(s.adapter_file)), sizeof v->adapter_file);
    g_strstrip(v->adapter_file);
    g_strstrip(v->prompt);
    g_strstrip(v->endpoint);
    /* Another engine, or one that was down: check the prompt against its model. An engine
     * that still does not answer is reported by the repaint itself. */
    if (endpoint_changed || !s.models) show_model(&s, v);
    problem = check_prompt(infill_model_list_get(s.models, 0), v->prompt);
    if (!problem) {
      ok = TRUE;
      break;
    }
    {
      /* The problem first, then the vocabulary to fix it with. */
      gchar* text = g_strdup_printf("%s.\n\n%s", problem, s.model_text ? s.model_text : "");
      gtk_label_set_text(GTK_LABEL(s.status), text);
      g_free(text);
    }
    g_free(problem);
  }
  v->seed = (gint32)(seed & 0x7fffffff);
  v->random_seed = random_seed;
  infill_model_list_delete(s.models);
  g_free(s.model_text);
  gtk_widget_destroy(dialog);
  return ok;
}

/* ---------------------------------------------------------------------------------------- */
/* run                                                                                      */
/* ---------------------------------------------------------------------------------------- */

static void run(const gchar* name, gint nparams, const GimpParam* param, gint* nreturn_vals,
                GimpParam** return_vals) {
  static GimpParam values[2];
  GimpRunMode run_mode = (GimpRunMode)param[0].data.d_int32;
  gint32 image = param[1].data.d_image;
  gint32 drawable = param[2].data.d_drawable;
  GimpPDBStatusType status = GIMP_PDB_SUCCESS;
  RepaintValues v = kDefaults;
  gchar* error = NULL;
  gint32 layer = -1;
  static gchar* last_error = NULL;

  gegl_init(NULL, NULL);
  *nreturn_vals = 2;
  *return_vals = values;
  values[0].type = GIMP_PDB_STATUS;
  values[1].type = GIMP_PDB_LAYER;
  values[1].data.d_layer = -1;

  switch (run_mode) {
    case GIMP_RUN_INTERACTIVE:
      gimp_get_data(PLUG_IN_PROC, &v);
      if (!repaint_dialog(&v)) status = GIMP_PDB_CANCEL;
      break;
    case GIMP_RUN_NONINTERACTIVE:
      if (nparams != NPARAMS && nparams != NPARAMS_WITHOUT_ADAPTER) {
        status = GIMP_PDB_CALLING_ERROR;
        error = g_strdup_printf("%s takes %d arguments (%d without the LoRA ones), got %d", name, NPARAMS,
                                NPARAMS_WITHOUT_ADAPTER, nparams);
        break;
      }
      g_strlcpy(v.prompt, param[3].data.d_string ? param[3].data.d_string : "", sizeof v.prompt);
      v.seed = param[4].data.d_int32;
      v.random_seed = v.seed < 0;
      v.steps = param[5].data.d_int32;
      v.strength = param[6].data.d_float;
      v.guidance = param[7].data.d_float;
      g_strlcpy(v.endpoint, param[8].data.d_string ? param[8].data.d_string : "",
                sizeof v.endpoint);
      g_strlcpy(v.token_file, param[9].data.d_string ? param[9].data.d_string : "",
                sizeof v.token_file);
      if (nparams == NPARAMS) {
        g_strlcpy(v.adapter_file, param[10].data.d_string ? param[10].data.d_string : "", sizeof v.adapter_file);
        v.adapter_strength = param[11].data.d_float;
      }
      if (v.steps < 0 || v.steps > 1000 || v.strength < 0 || v.strength > 1 || v.guidance < 0 ||
          v.guidance > 20) {
        status = GIMP_PDB_CALLING_ERROR;
        error = g_strdup_printf("steps %d must be 0..1000, strength %g 0..1, guidance %g 0..20",
                                v.steps, v.strength, v.guidance);
      } else if (v.adapter_file[0] &&
                 !(v.adapter_strength >= kAdapterStrengthMin && v.adapter_strength <= kAdapterStrengthMax)) {
        status = GIMP_PDB_CALLING_ERROR;
        error = g_strdup_printf("adapter-strength %g must be %g..%g", v.adapter_strength, kAdapterStrengthMin,
                                kAdapterStrengthMax);
      }
      break;
    case GIMP_RUN_WITH_LAST_VALS:
      gimp_get_data(PLUG_IN_PROC, &v);
      break;
  }

  if (status == GIMP_PDB_SUCCESS) {
    layer = repaint(image, drawable, &v, &error);
    if (layer == -1) status = GIMP_PDB_EXECUTION_ERROR;
  }
  if (status == GIMP_PDB_SUCCESS) {
    values[1].data.d_layer = layer;
    if (run_mode != GIMP_RUN_NONINTERACTIVE) gimp_displays_flush();
    if (run_mode == GIMP_RUN_INTERACTIVE) gimp_set_data(PLUG_IN_PROC, &v, sizeof v);
  } else if (error) {
    /* The caller (a script) gets the message as the procedure's error; a user sees it too. */
    g_free(last_error);
    last_error = g_strdup_printf("Infill: %s", error);
    if (run_mode == GIMP_RUN_INTERACTIVE) gimp_message(last_error);
    values[1].type = GIMP_PDB_STRING;
    values[1].data.d_string = last_error;
  } else {
    *nreturn_vals = 1;
  }
  values[0].data.d_status = status;
  g_free(error);
}

int main(int argc, char* argv[]) {
  if (argc >= 2 && strcmp(argv[1], CANCEL_WATCH_ARG) == 0) return cancel_watch_main(argc, argv);
  g_self_path = argv[0];
  return gimp_main(&PLUG_IN_INFO, argc, argv);
}
