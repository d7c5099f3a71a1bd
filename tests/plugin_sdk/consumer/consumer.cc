// The C++ wrapper against the installed library; needs no engine.
#include <infill/infill_client.hpp>

#include <iostream>

int main() {
  try {
    infill::client::ClientOptions o;
    o.endpoint = "unix:/nonexistent/engine.sock";
    infill::client::Client client(o);
    client.health();
  } catch (const infill::client::Error& e) {
    std::cout << e.code_name() << ": " << e.what() << "\n";
    return e.code() == INFILL_ERROR_CONNECTION ? 0 : 1;
  }
  return 1;
}
