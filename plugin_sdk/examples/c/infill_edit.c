/* infill_edit: upload a template, submit one edit with a mask, print its progress, write the
 * result. A small host program in C99 against libinfill_client (docs/sdk.md).
 *
 *   infill_edit [-e ENDPOINT] [-t TOKEN] [-w WAIT_S] [-s STEPS] [-S SEED] [-p PROMPT] TEMPLATE MASK OUT.png
 *
 * MASK is an image file (0 = keep, 255 = regenerate) or a rectangle "rect:X,Y,W,H".
 * WAIT_S: how long to wait for a starting engine (default 30 s).
 * ENDPOINT defaults to the local engine ("unix:$XDG_RUNTIME_DIR/infill/engine.sock").
 * Exit status: 0 done, 1 the engine or the edit failed, 2 bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infill/infill_client.h>

static void on_progress(void* user, const infill_progress* p) {
  (void)user;
  printf("progress %u/%u\n", (unsigned)p->steps_done, (unsigned)p->steps_total);
  fflush(stdout);
}

static void on_preview(void* user, const infill_preview* p) {
  int* previews = (int*)user;
  ++*previews;
  printf("preview at step %u: %ux%u, %lu bytes of PNG\n", (unsigned)p->steps_done, (unsigned)p->width,
         (unsigned)p->height, (unsigned long)p->png_size);
}

static void on_done(void* user, const infill_done* d) {
  (void)user;
  if (d->error)
    printf("edit %llu ended %s: %s\n", (unsigned long long)d->edit_id, infill_job_state_name(d->state),
           infill_error_message(d->error));
  else
    printf("edit %llu done: %u steps, %.0f ms, %lu bytes\n", (unsigned long long)d->edit_id, (unsigned)d->steps_run,
           d->total_ms, (unsigned long)d->png_size);
}

/* Prints and frees `e`; returns 1 when there was an error. */
static int report(const char* what, infill_error* e) {
  if (!e) return 0;
  fprintf(stderr, "infill_edit: %s: %s [%s", what, infill_error_message(e), infill_error_code_name(infill_error_get_code(e)));
  if (infill_error_http_status(e)) fprintf(stderr, ", HTTP %d", infill_error_http_status(e));
  fprintf(stderr, "]\n");
  infill_error_delete(e);
  return 1;
}

static unsigned char* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  unsigned char* data = NULL;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0) {
    data = (unsigned char*)malloc((size_t)n);
    if (data && fread(data, 1, (size_t)n, f) != (size_t)n) {
      free(data);
      data = NULL;
    }
    *size = (size_t)n;
  }
  fclose(f);
  return data;
}

static int usage(void) {
  fprintf(stderr, "usage: infill_edit [-e ENDPOINT] [-t TOKEN] [-w WAIT_S] [-s STEPS] [-S SEED] [-p PROMPT] TEMPLATE MASK OUT.png\n"
                  "  MASK: an image file, or rect:X,Y,W,H\n");
  return 2;
}

int main(int argc, char** argv) {
  const char* endpoint = NULL;
  const char* token = NULL;
  const char* prompt = NULL;
  const char* positional[3];
  int npos = 0, i, failed = 0, previews = 0;
  unsigned steps = 0;
  unsigned wait_s = 30;
  unsigned long long seed = 0;
  unsigned char* mask_bytes = NULL;
  infill_client_options options;
  infill_client* client = NULL;
  infill_template_info tmpl;
  infill_edit_params params;
  infill_job* job = NULL;
  infill_model_list* models = NULL;

  for (i = 1; i < argc; ++i) {
    if (argv[i][0] == '-' && argv[i][1] != '\0' && argv[i][2] == '\0' && i + 1 < argc) {
      const char* v = argv[++i];
      switch (argv[i - 1][1]) {
        case 'e': endpoint = v; break;
        case 't': token = v; break;
        case 'w': wait_s = (unsigned)strtoul(v, NULL, 10); break;
        case 's': steps = (unsigned)strtoul(v, NULL, 10); break;
        case 'S': seed = strtoull(v, NULL, 10); break;
        case 'p': prompt = v; break;
        default: return usage();
      }
    } else if (npos < 3) {
      positional[npos++] = argv[i];
    } else {
      return usage();
    }
  }
  if (npos != 3) return usage();

  if (infill_api_version() >> 16 != INFILL_CLIENT_API_VERSION_MAJOR) {
    fprintf(stderr, "infill_edit: libinfill_client %s has an incompatible API\n", infill_library_version());
    return 1;
  }
  infill_client_options_init(&options);
  options.endpoint = endpoint;
  options.token = token;
  if (report("connecting", infill_client_create(&options, &client))) return 1;
  printf("engine %s, client %s\n", infill_client_endpoint(client), infill_client_name(client));
  /* A freshly started engine answers 503 while it loads its model. */
  if (report("waiting for the engine", infill_client_wait_ready(client, wait_s * 1000u))) failed = 1;

  if (!failed && !report("listing models", infill_client_list_models(client, &models))) {
    const infill_model_info* m = infill_model_list_get(models, 0);
    if (m && m->free_text) printf("model %s: %u steps by default, free-text prompts\n", m->id, (unsigned)m->default_steps);
    else if (m) printf("model %s: %u steps by default, %lu prompt words\n", m->id, (unsigned)m->default_steps, (unsigned long)m->vocabulary_count);
    infill_model_list_delete(models);
  } else {
    failed = 1;
  }

  infill_template_info_init(&tmpl);
  if (!failed && report("uploading the template", infill_client_upload_template_file(client, positional[0], &tmpl))) failed = 1;
  if (!failed) printf("template %.12s... %ux%u (%s)\n", tmpl.id, (unsigned)tmpl.width, (unsigned)tmpl.height, tmpl.created ? "new" : "known");

  infill_edit_params_init(&params);
  params.template_id = tmpl.id;
  if (strncmp(positional[1], "rect:", 5) == 0) {
    if (sscanf(positional[1] + 5, "%d,%d,%d,%d", &params.mask_rect[0], &params.mask_rect[1], &params.mask_rect[2],
               &params.mask_rect[3]) != 4) {
      fprintf(stderr, "infill_edit: mask '%s' is not rect:X,Y,W,H\n", positional[1]);
      infill_client_destroy(client);
      return 2;
    }
  } else {
    mask_bytes = read_file(positional[1], &params.mask_png_size);
    if (!mask_bytes) {
      fprintf(stderr, "infill_edit: cannot read the mask %s\n", positional[1]);
      infill_client_destroy(client);
      return 2;
    }
    params.mask_png = mask_bytes;
  }
  params.steps = steps;
  params.seed = seed;
  params.prompt = prompt;
  params.preview_every_steps = 2;
  params.on_progress = on_progress;
  params.on_preview = on_preview;
  params.on_done = on_done;
  params.user_data = &previews;
  if (!failed && report("submitting the edit", infill_client_submit_edit(client, &params, &job))) failed = 1;
  free(mask_bytes);

  if (!failed) {
    printf("edit %llu submitted\n", (unsigned long long)infill_job_id(job));
    if (report("waiting", infill_job_wait(job, 600000))) failed = 1;
  }
  if (!failed && infill_job_get_state(job) != INFILL_JOB_DONE) failed = 1; /* on_done printed why */
  if (!failed && report("writing the result", infill_job_write_result(job, positional[2]))) failed = 1;
  if (!failed) printf("wrote %s (%d previews)\n", positional[2], previews);

  infill_job_release(job);
  infill_client_destroy(client);
  return failed;
}
