#pragma once
// HTTP/1.1 transport that cannot be exhausted by its clients (Boost.Asio + Boost.Beast's
// parser). It knows nothing of OpenAI: it reads requests under deadlines and size limits and
// hands them to HttpRoutes.
//
// Threads: one I/O thread runs every connection (accept, parse, deadlines, quick responses
// such as /health and /metrics), so no number of idle or slow connections can starve a probe.
// Routes that block (generation, tokenization) run on worker threads, at most
// HttpLimits::max_workers at once; one more gets an immediate 429. A worker owns its
// connection until its response is written (writes have a deadline), then gives it back.
//
// Every early answer (401, 404, 413, 431, 400) on a request that carries a body closes the
// connection after the response, so an unread body can never be parsed as a second request.
// Framing follows RFC 9112: only `chunked` is decoded, and only as the sole transfer coding
// (otherwise 400, or 501 for a coding such as gzip before it); Transfer-Encoding with
// Content-Length or in HTTP/1.0, and obs-fold, are 400. Every such answer carries
// `Connection: close`; the close lingers (half-closed, discarding input for a bounded time and
// byte count) so that a client still sending its body reads the answer instead of a reset.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fathom {

class MetricsRegistry;

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpLimits {
  int64_t max_body_bytes = 1 << 20;     // also holds for chunked bodies (413 past it)
  int32_t max_header_bytes = 16 << 10;  // request line + headers (431 past it)
  int32_t max_connections = 2048;       // open connections; past it new ones get 503 and close
  int32_t max_workers = 256;            // blocking handlers at once; past it 429
  int32_t header_timeout_ms = 10000;    // from a request's first byte to its last header byte
  int32_t body_timeout_ms = 30000;      // to read a whole body
  int32_t idle_timeout_ms = 60000;      // a keep-alive connection waiting for its next request
  int32_t write_timeout_ms = 30000;     // for any one write to make progress
};

struct HttpRequest {
  std::string id;      // X-Request-Id: the client's (if it is 1-64 of [A-Za-z0-9._-]) or generated
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query
  std::string query;
  HttpHeaders headers;  // names lower-cased, in arrival order
  std::string body;
  bool has_body = false;  // Content-Length > 0 or chunked (known once the headers are read)

  // The first header with this lower-case name; "" when absent.
  std::string header(std::string_view lower_name) const;
};

// What a handler running on a worker sees of its client.
class HttpClient {
 public:
  virtual ~HttpClient() = default;
  // False once the client has closed or reset the connection.
  virtual bool alive() = 0;
  // Writes one chunk of a streamed body; false when the client is gone or stopped reading
  // for write_timeout_ms.
  virtual bool write(std::string_view data) = 0;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;
  // Set for a streamed response (Transfer-Encoding: chunked; worker routes only): called after
  // the head is sent, it writes the body through the client and returns false when it gave up.
  std::function<bool(HttpClient&)> stream;
};

struct HttpRoutes {
  // On the I/O thread once the headers are in: a response here answers the request without
  // reading its body (authentication, unknown routes). Must not block.
  std::function<std::optional<HttpResponse>(const HttpRequest&)> check_head;
  // Whether the route answers on the I/O thread (fast, never blocks) or on a worker.
  std::function<bool(const HttpRequest&)> runs_inline;
  // The response; exceptions are the router's to turn into error responses (one escaping here
  // is answered 500). `client` lets worker routes notice a client that went away.
  std::function<HttpResponse(const HttpRequest&, HttpClient& client)> handle;
  // An error response of the router's shape for the transport's own failures.
  std::function<HttpResponse(int status, const std::string& message, const std::string& code)> error;
  // Called once per answered request with the status sent (metrics, logs).
  std::function<void(const HttpRequest&, int status)> done;
};

class HttpTransport {
 public:
  HttpTransport(HttpLimits limits, HttpRoutes routes, MetricsRegistry& metrics);
  ~HttpTransport();  // stop()s

  // Binds host:port (0 = any free port) with the system's largest listen backlog and starts
  // the I/O thread. Returns the bound port; throws fathom::Error when it cannot bind.
  int start(const std::string& host, int port);
  // Stops accepting, gives responses being written `grace` (at least two seconds) to finish,
  // then closes every connection (workers' writes fail at once) and waits for the I/O thread
  // and every worker to end. Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

  struct Impl;  // public so the connections in the .cpp can name it; opaque here

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace fathom
