/* The public header compiles as strict C99 (built by a ctest with -std=c99 -pedantic -Werror). */
#include <infill/infill_client.h>

int main(void) {
  infill_client_options options;
  infill_edit_params params;
  infill_client_options_init(&options);
  infill_edit_params_init(&params);
  return (options.api_version == INFILL_CLIENT_API_VERSION && params.struct_size == sizeof params) ? 0 : 1;
}
