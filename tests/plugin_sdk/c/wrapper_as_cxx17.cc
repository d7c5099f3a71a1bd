// The C++ wrapper compiles as C++17 (a ctest runs the compiler with -std=c++17 -fsyntax-only).
#include <infill/infill_client.hpp>

int main() {
  infill::client::EditRequest request;
  request.mask_rect = {{0, 0, 8, 8}};
  request.adapters.push_back({"adapter-id", 0.5});
  request.references.push_back("template-id");
  request.adapters_from_step = 2;
  infill::client::AdapterInfo info;
  return request.steps == 0 && info.layers == 0 ? 0 : 1;
}
