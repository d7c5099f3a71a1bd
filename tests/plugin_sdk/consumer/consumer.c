/* Links against the installed libinfill_client; needs no engine. */
#include <stdio.h>
#include <string.h>

#include <infill/infill_client.h>

int main(void) {
  infill_client_options options;
  infill_client* client = NULL;
  infill_error* error;
  infill_client_options_init(&options);
  options.endpoint = "gopher://nowhere";
  error = infill_client_create(&options, &client);
  if (!error || infill_error_get_code(error) != INFILL_ERROR_INVALID_ARGUMENT || client) return 1;
  printf("api %u.%u, library %s: %s\n", (unsigned)(infill_api_version() >> 16), (unsigned)(infill_api_version() & 0xFFFF),
         infill_library_version(), infill_error_message(error));
  infill_error_delete(error);
  return infill_api_version() == INFILL_CLIENT_API_VERSION ? 0 : 1;
}
