#pragma once
// A minimal blocking HTTP/1.1 client on raw POSIX sockets for the server tests: every request
// uses its own connection (Connection: close) and every read is bounded by a timeout, so a
// misbehaving server fails a test instead of hanging it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace infill::test {

struct Endpoint {
  std::string unix_path;  // non-empty: Unix socket
  uint16_t port = 0;      // otherwise TCP on 127.0.0.1
};

inline int connect_to(const Endpoint& ep) {
  if (!ep.unix_path.empty()) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, ep.unix_path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      throw std::runtime_error("connect " + ep.unix_path + ": " + std::strerror(errno));
    }
    return fd;
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(ep.port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("connect tcp: ") + std::strerror(errno));
  }
  return fd;
}

inline void send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may close early (e.g. a 413 before the body): not an error here
    sent += static_cast<size_t>(n);
  }
}

// Reads what arrives within `timeout_ms`; returns false on EOF or error.
inline bool read_some(int fd, std::string& out, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return true;  // nothing yet
  char buf[65536];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  if (n <= 0) return false;
  out.append(buf, static_cast<size_t>(n));
  return true;
}

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
};

inline Response parse_response(const std::string& raw) {
  Response r;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  const std::string head = raw.substr(0, end);
  r.status = std::atoi(head.substr(9, 3).c_str());
  size_t pos = head.find("\r\n");
  while (pos != std::string::npos && pos < head.size()) {
    const size_t next = head.find("\r\n", pos + 2);
    const std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string key = line.substr(0, colon);
      for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers[key] = line.substr(colon + 2);
    }
    pos = next;
  }
  r.body = raw.substr(end + 4);
  if (r.headers.count("content-length")) r.body.resize(std::min(r.body.size(), std::stoul(r.headers["content-length"])));
  return r;
}

// Sends raw bytes and reads the reply until the server closes (bounded by timeout_ms).
inline Response raw_exchange(const Endpoint& ep, const std::string& request, int timeout_ms = 20000) {
  const int fd = connect_to(ep);
  send_all(fd, request);
  std::string raw;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (!read_some(fd, raw, 50)) break;
    // Complete by Content-Length: no need to wait for the close.
    const size_t end = raw.find("\r\n\r\n");
    if (end != std::string::npos) {
      Response r = parse_response(raw);
      if (r.headers.count("content-length") && raw.size() >= end + 4 + std::stoul(r.headers["content-length"])) break;
    }
  }
  ::close(fd);
  return parse_response(raw);
}

inline Response request(const Endpoint& ep, const std::string& method, const std::string& target,
                        const std::string& body = "", std::vector<std::string> headers = {}) {
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  if (!body.empty() || method == "POST") req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  return raw_exchange(ep, req);
}

struct MultipartField {
  std::string name, filename, content_type, data;
};

inline std::pair<std::string, std::string> multipart_body(const std::vector<MultipartField>& fields) {
  const std::string boundary = "----infilltestboundary7MA4YWxkTrZu0gW";
  std::string body;
  for (const auto& f : fields) {
    body += "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + f.name + "\"";
    if (!f.filename.empty()) body += "; filename=\"" + f.filename + "\"";
    body += "\r\n";
    if (!f.content_type.empty()) body += "Content-Type: " + f.content_type + "\r\n";
    body += "\r\n" + f.data + "\r\n";
  }
  body += "--" + boundary + "--\r\n";
  return {"Content-Type: multipart/form-data; boundary=" + boundary, body};
}

struct SseEvent {
  std::string type;
  nlohmann::json data;
};

// A subscription to /v1/events that collects events until told to stop.
class EventStream {
 public:
  EventStream(const Endpoint& ep, const std::string& client, std::vector<std::string> headers = {}) {
    fd_ = connect_to(ep);
    std::string req = "GET /v1/events?client=" + client + " HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n";
    for (const auto& h : headers) req += h + "\r\n";
    send_all(fd_, req + "\r\n");
    // Wait for the response head so events submitted after this constructor are not missed.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (buffer_.find("\r\n\r\n") == std::string::npos && std::chrono::steady_clock::now() < deadline)
      if (!read_some(fd_, buffer_, 50)) break;
    const size_t end = buffer_.find("\r\n\r\n");
    if (end == std::string::npos) throw std::runtime_error("no event stream response");
    head_ = parse_response(buffer_.substr(0, end + 4));
    buffer_.erase(0, end + 4);
  }
  ~EventStream() { ::close(fd_); }
  EventStream(const EventStream&) = delete;
  EventStream& operator=(const EventStream&) = delete;

  const Response& head() const { return head_; }

  // Reads events until `stop` returns true for one or the timeout passes; returns all so far.
  template <class Stop>
  const std::vector<SseEvent>& wait_for(Stop stop, int timeout_ms = 30000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      for (const auto& e : events_)
        if (stop(e)) return events_;
      if (std::chrono::steady_clock::now() >= deadline) return events_;
      if (!read_some(fd_, buffer_, 50)) {
        parse();
        return events_;
      }
      parse();
    }
  }
  const std::vector<SseEvent>& events() const { return events_; }

 private:
  void parse() {
    size_t end;
    while ((end = buffer_.find("\n\n")) != std::string::npos) {
      const std::string block = buffer_.substr(0, end);
      buffer_.erase(0, end + 2);
      SseEvent e;
      size_t pos = 0;
      while (pos < block.size()) {
        size_t nl = block.find('\n', pos);
        const std::string line = block.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
        if (line.rfind("event: ", 0) == 0) e.type = line.substr(7);
        if (line.rfind("data: ", 0) == 0) e.data = nlohmann::json::parse(line.substr(6), nullptr, false);
        if (nl == std::string::npos) break;
        pos = nl + 1;
      }
      if (!e.type.empty()) events_.push_back(std::move(e));
    }
  }
  int fd_ = -1;
  std::string buffer_;
  Response head_;
  std::vector<SseEvent> events_;
};

}  // namespace infill::test
