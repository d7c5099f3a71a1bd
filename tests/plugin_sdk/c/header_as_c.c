/* The public header compiles as strict C99 (built by a ctest with -std=c99 -pedantic -Werror). */
#include <infill/infill_client.h>

int main(void) {
  infill_client_options options;
  infill_edit_params params;
  infill_edit_adapter adapter;
  infill_adapter_info info;
  const char* references[1] = {"template-id"};
  infill_client_options_init(&options);
  infill_edit_params_init(&params);
  infill_edit_adapter_init(&adapter);
  infill_adapter_info_init(&info);
  adapter.id = info.id;
  params.adapters = &adapter;
  params.adapter_count = 1;
  params.references = references;
  params.reference_count = 1;
  params.adapters_from_step = 2;
  return (options.api_version == INFILL_CLIENT_API_VERSION && params.struct_size == sizeof params) ? 0 : 1;
}
