#include "server/http_transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>

#include "base/error.h"
#include "engine/metrics.h"
#include "server/http_framing.h"

namespace fathom {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using std::chrono::milliseconds;

namespace {

// Lingering close (RFC 9112 §9.6): a connection closed after an early answer (413, 401 with an
// unread body, a framing error) still reads and drops what the client sends, so a client that
// writes its whole body before reading (urllib, curl) gets the answer instead of a reset. It ends
// at the client's EOF, after kLingerTime (or body_timeout_ms, if shorter), or past kLingerBytes:
// 64 MiB lets a body 64 times the default limit finish (about 30 ms of reading on loopback), and
// no client keeps a lingering connection longer than it could keep a slow body. It runs on the
// I/O thread, holds no worker, and counts as an open connection (max_connections) until it ends.
constexpr milliseconds kLingerTime(2000);
constexpr size_t kLingerBytes = size_t{64} << 20;
constexpr size_t kLingerReadBytes = 64 << 10;
// Bytes asked of the socket per read while a request's head arrives.
constexpr size_t kHeadReadBytes = 4096;
// When accept() fails for lack of file descriptors, wait this long before trying again.
constexpr milliseconds kAcceptBackoff(100);
// stop() waits this long for responses to finish, then for connections to close, by themselves.
constexpr milliseconds kStopGrace(2000);

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// Status line and headers. `content_length` unset: a chunked body (HTTP/1.1) or one that ends
// when the connection closes (HTTP/1.0).
std::string response_head(const HttpResponse& r, std::optional<size_t> content_length, bool keep_alive,
                          unsigned version, const std::string& request_id) {
  std::string h = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  h += std::to_string(r.status);
  h += ' ';
  h += std::string(bhttp::obsolete_reason(bhttp::int_to_status(static_cast<unsigned>(r.status))));
  h += "\r\nContent-Type: " + r.content_type + "\r\n";
  if (content_length) h += "Content-Length: " + std::to_string(*content_length) + "\r\n";
  else if (version != 10) h += "Transfer-Encoding: chunked\r\n";
  for (const auto& [name, value] : r.headers) h += name + ": " + value + "\r\n";
  if (!request_id.empty()) h += "X-Request-Id: " + request_id + "\r\n";
  if (!keep_alive) h += "Connection: close\r\n";
  else if (version == 10) h += "Connection: keep-alive\r\n";
  h += "\r\n";
  return h;
}

bool peer_closed(const beast::error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
         ec == asio::error::broken_pipe || ec == asio::error::bad_descriptor;
}

}  // namespace

std::string HttpRequest::header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_name) return value;
  return "";
}

struct HttpTransport::Impl {
  Impl(HttpLimits l, HttpRoutes r, MetricsRegistry& m)
      : limits(l),
        routes(std::move(r)),
        metrics(m),
        open_connections(m.gauge("fathom_http_open_connections", "Open HTTP connections")),
        busy_workers(m.gauge("fathom_http_busy_workers", "HTTP requests being handled on worker threads")),
        rejected(m.counter("fathom_http_connections_rejected_total",
                           "HTTP connections refused with 503 because http.max_connections were open")) {
    std::random_device rd;
    id_salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }

  void accept();
  void reject(tcp::socket& socket);
  bool try_start_worker();
  void worker_done();
  void count_timeout(const char* phase) {
    metrics.counter("fathom_http_timeouts_total", "HTTP connections closed for missing a deadline, by phase",
                    {{"phase", phase}})
        .inc();
  }
  std::string new_request_id() {
    char buf[40];
    std::snprintf(buf, sizeof buf, "req-%016llx%08llx", static_cast<unsigned long long>(id_salt),
                  static_cast<unsigned long long>(id_counter.fetch_add(1) & 0xffffffffu));
    return buf;
  }

  const HttpLimits limits;
  const HttpRoutes routes;
  MetricsRegistry& metrics;
  Gauge& open_connections;
  Gauge& busy_workers;
  Counter& rejected;
  uint64_t id_salt = 0;
  std::atomic<uint64_t> id_counter{0};
  std::atomic<bool> stopping{false};
  std::atomic<int> connections{0};

  std::mutex mutex;
  std::condition_variable workers_cv;
  std::unordered_set<int> fds;  // every open connection's socket (stop() shuts them down)
  int workers = 0;

  std::thread thread;
  // Last, so that it goes first: pending handlers own connections whose destructors use the
  // members above.
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_backoff{io};
};

namespace {

// One client connection. Lives on the I/O thread except while a worker owns it (between
// on_body() and after_response()), when no asynchronous operation is pending on it.
class Connection : public std::enable_shared_from_this<Connection>, public HttpClient {
 public:
  Connection(HttpTransport::Impl& server, tcp::socket socket)
      : server_(server), stream_(std::move(socket)), fd_(stream_.socket().native_handle()) {
    server_.connections.fetch_add(1);
    server_.open_connections.inc();
    std::lock_guard lock(server_.mutex);
    server_.fds.insert(fd_);
  }

  ~Connection() override {
    unregister();
    server_.open_connections.inc(-1);
    server_.connections.fetch_sub(1);
  }

  void start() {
    beast::error_code ec;
    stream_.socket().set_option(tcp::no_delay(true), ec);
    stream_.socket().non_blocking(true, ec);  // worker writes poll with a deadline
    wait_for_request();
  }

  // HttpClient, used by the worker that owns the connection.
  bool alive() override {
    pollfd p{fd_, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) < 0) return true;
    return !(p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
  }

  bool write(std::string_view data) override {
    if (data.empty()) return true;  // an empty chunk would end the body
    if (!chunked_) return write_all(data);
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string chunk = size;
    chunk.append(data);
    chunk += "\r\n";
    return write_all(chunk);
  }

 private:
  const HttpLimits& limits() const { return server_.limits; }

  void unregister() {
    std::lock_guard lock(server_.mutex);
    server_.fds.erase(fd_);
  }

  // Waits for a request's first byte: header_timeout_ms on a new connection, idle_timeout_ms
  // between keep-alive requests. Bytes already buffered (pipelining) start the next one at once.
  void wait_for_request() {
    if (buffer_.size() > 0) return read_head();
    stream_.expires_after(milliseconds(first_ ? limits().header_timeout_ms : limits().idle_timeout_ms));
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) {
        if (ec == beast::error::timeout) self->server_.count_timeout(self->first_ ? "header" : "idle");
        return self->close();
      }
      self->buffer_.commit(n);
      self->read_head();
    });
  }

  void read_head() {
    request_ = HttpRequest{};
    head_scanned_ = 0;
    stream_.expires_after(milliseconds(limits().header_timeout_ms));
    read_raw_head();
  }

  // Reads until the buffer holds the whole head (or more than max_header_bytes, which Beast then
  // answers 431), refusing obs-fold on the way; then Beast parses the head from the buffer.
  void read_raw_head() {
    const auto data = buffer_.data();
    const size_t head_limit = static_cast<size_t>(limits().max_header_bytes);
    const std::string_view bytes(static_cast<const char*>(data.data()), std::min(data.size(), head_limit));
    const RawHead scan = scan_raw_head(bytes, head_scanned_);
    if (scan == RawHead::kFolded) return refuse_framing({400, "obsolete line folding in the request head"});
    if (scan == RawHead::kComplete || data.size() >= head_limit) return parse_head();
    auto on_read = [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->fail_read(ec, "header");
      self->buffer_.commit(n);
      self->read_raw_head();
    };
    stream_.async_read_some(buffer_.prepare(kHeadReadBytes), std::move(on_read));
  }

  void parse_head() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(limits().max_header_bytes));
    // No body limit while the head is read: Beast would refuse a long Content-Length (413) as the
    // head completes, before the API key is checked. on_head applies it after check_head.
    parser_->body_limit(boost::none);
    bhttp::async_read_header(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->fail_read(ec, "header");
      self->on_head();
    });
  }

  void on_head() {
    const auto& msg = parser_->get();
    request_.method = std::string(msg.method_string());
    const std::string_view target = msg.target();
    const size_t q = target.find('?');
    request_.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) request_.query = std::string(target.substr(q + 1));
    for (const auto& field : msg) request_.headers.emplace_back(lower(field.name_string()), std::string(field.value()));
    request_.has_body = parser_->chunked() || parser_->content_length().value_or(0) > 0;
    const std::string client_id = request_.header("x-request-id");
    request_.id = valid_request_id(client_id) ? client_id : server_.new_request_id();
    keep_alive_ = msg.keep_alive();
    version_ = msg.version();

    if (std::optional<FramingError> bad = framing_error(msg, parser_->chunked())) return refuse_framing(*bad);
    if (std::optional<HttpResponse> early = server_.routes.check_head(request_)) {
      if (request_.has_body) keep_alive_ = false;  // the unread body must not become a request
      return respond(std::move(*early));
    }
    if (parser_->content_length().value_or(0) > static_cast<uint64_t>(limits().max_body_bytes)) {
      keep_alive_ = false;  // refused from its Content-Length: the body is never read
      return respond(body_too_large());
    }
    parser_->body_limit(static_cast<uint64_t>(limits().max_body_bytes));  // no body byte parsed yet
    if (beast::iequals(msg[bhttp::field::expect], "100-continue") && !parser_->is_done()) {
      out_ = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(milliseconds(limits().write_timeout_ms));
      asio::async_write(stream_, asio::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    if (parser_->is_done()) return on_body();
    stream_.expires_after(milliseconds(limits().body_timeout_ms));
    bhttp::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->fail_read(ec, "body");
      self->on_body();
    });
  }

  // A request whose end cannot be known: answered, then the connection closes (where the next
  // request would begin is unknown), its unread bytes dropped by the lingering close.
  void refuse_framing(const FramingError& e) {
    keep_alive_ = false;
    if (request_.id.empty()) request_.id = server_.new_request_id();
    respond(server_.routes.error(e.status, e.message, e.status == 501 ? "not_implemented" : "bad_request"));
  }

  // A request that could not be read: answered when there is something useful to say, and the
  // connection closes either way (the rest of the stream cannot be trusted).
  void fail_read(const beast::error_code& ec, const char* phase) {
    keep_alive_ = false;
    if (request_.id.empty()) request_.id = server_.new_request_id();
    if (ec == beast::error::timeout) {
      server_.count_timeout(phase);
      if (std::string_view(phase) == "header") return close();  // slow or idle: nobody to tell
      return respond(server_.routes.error(408, "the request body did not arrive within " +
                                                   std::to_string(limits().body_timeout_ms) + " ms",
                                          "request_timeout"));
    }
    if (peer_closed(ec)) return close();
    if (ec == bhttp::error::header_limit)
      return respond(server_.routes.error(
          431, "the request headers exceed the limit of " + std::to_string(limits().max_header_bytes) + " bytes",
          "request_header_fields_too_large"));
    if (ec == bhttp::error::body_limit) return respond(body_too_large());
    respond(server_.routes.error(400, "malformed HTTP request: " + ec.message(), "bad_request"));
  }

  HttpResponse body_too_large() {
    return server_.routes.error(
        413, "the request body exceeds the limit of " + std::to_string(limits().max_body_bytes) + " bytes",
        "request_too_large");
  }

  void on_body() {
    request_.body = std::move(parser_->get().body());
    parser_.reset();
    if (server_.routes.runs_inline(request_)) return respond(run_handler());
    if (server_.stopping.load())
      return respond(server_.routes.error(503, "the server is shutting down", "draining"));
    if (!server_.try_start_worker())
      return respond(server_.routes.error(
          429, "too many requests in progress (" + std::to_string(limits().max_workers) + "); retry later",
          "too_many_requests"));
    stream_.expires_never();
    try {
      std::thread([self = shared_from_this()]() mutable {
        HttpTransport::Impl& server = self->server_;
        self->run_on_worker();
        self.reset();  // before worker_done(): stop() may return as soon as that counts down
        server.worker_done();
      }).detach();
    } catch (const std::system_error& e) {
      server_.worker_done();
      spdlog::error("cannot start an HTTP worker thread: {}", e.what());
      respond(server_.routes.error(503, "the server cannot take more work now", "unavailable"));
    }
  }

  HttpResponse run_handler() {
    try {
      return server_.routes.handle(request_, *this);
    } catch (const std::exception& e) {
      spdlog::error("internal error on {} {}: {}", request_.method, request_.path, e.what());
    } catch (...) {
      spdlog::error("internal error on {} {}", request_.method, request_.path);
    }
    return server_.routes.error(500, "internal error", "internal_error");
  }

  // On the I/O thread: a complete response, written asynchronously under write_timeout_ms.
  void respond(HttpResponse r) {
    if (r.stream) r = server_.routes.error(500, "a streamed response on the I/O thread", "internal_error");
    status_ = r.status;
    if (server_.stopping.load()) keep_alive_ = false;
    out_ = response_head(r, r.body.size(), keep_alive_, version_, request_.id);
    out_ += r.body;
    stream_.expires_after(milliseconds(limits().write_timeout_ms));
    asio::async_write(stream_, asio::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec == beast::error::timeout) self->server_.count_timeout("write");
      self->after_response(!ec);
    });
  }

  // On a worker thread: runs the handler and writes its response with blocking writes under
  // write_timeout_ms, then hands the connection back to the I/O thread.
  void run_on_worker() {
    HttpResponse r = run_handler();
    status_ = r.status;
    if (server_.stopping.load()) keep_alive_ = false;
    bool ok;
    if (r.stream) {
      chunked_ = version_ != 10;
      if (!chunked_) keep_alive_ = false;  // an HTTP/1.0 stream ends when the connection closes
      ok = write_all(response_head(r, std::nullopt, keep_alive_, version_, request_.id));
      ok = ok && r.stream(*this);
      if (ok && chunked_) ok = write_all("0\r\n\r\n");
      chunked_ = false;
    } else {
      ok = write_all(response_head(r, r.body.size(), keep_alive_, version_, request_.id) + r.body);
    }
    r = HttpResponse{};  // the handler's state (e.g. a generation) ends on this thread
    asio::post(stream_.get_executor(), [self = shared_from_this(), ok] { self->after_response(ok); });
  }

  bool write_all(std::string_view data) {
    auto deadline = std::chrono::steady_clock::now() + milliseconds(limits().write_timeout_ms);
    size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
        deadline = std::chrono::steady_clock::now() + milliseconds(limits().write_timeout_ms);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const auto left =
            std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()).count();
        if (left <= 0) {
          server_.count_timeout("write");
          return false;
        }
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
        continue;
      }
      return false;
    }
    return true;
  }

  void after_response(bool ok) {
    if (server_.routes.done) server_.routes.done(request_, status_);
    if (ok && keep_alive_ && !server_.stopping.load()) {
      first_ = false;
      return wait_for_request();
    }
    linger_close();
  }

  // Half-closes, then drops what the client still sends for a moment (see kLingerTime): closing a
  // socket with unread input sends a reset that can destroy the response before the client reads
  // it. Runs on the I/O thread; a worker has already given the connection back.
  void linger_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    buffer_.clear();
    stream_.expires_after(std::min(kLingerTime, milliseconds(limits().body_timeout_ms)));
    discard();
  }

  void discard() {
    auto on_read = [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->lingered_ += n;
      if (ec || self->lingered_ > kLingerBytes) return self->close();
      self->discard();
    };
    stream_.async_read_some(buffer_.prepare(kLingerReadBytes), std::move(on_read));
  }

  void close() {
    unregister();
    beast::error_code ec;
    stream_.socket().close(ec);
  }

  HttpTransport::Impl& server_;
  beast::tcp_stream stream_;
  const int fd_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  HttpRequest request_;
  bool keep_alive_ = false;
  unsigned version_ = 11;
  bool first_ = true;
  bool chunked_ = false;  // a worker is streaming a chunked body
  int status_ = 0;
  std::string out_;  // the response being written by the I/O thread
  size_t head_scanned_ = 0;  // bytes of the buffered head already checked for obs-fold
  size_t lingered_ = 0;
};

}  // namespace

void HttpTransport::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor.is_open()) return;
    if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec == asio::error::no_memory) {
      spdlog::warn("HTTP accept failed ({}); retrying in {} ms", ec.message(), kAcceptBackoff.count());
      accept_backoff.expires_after(kAcceptBackoff);
      accept_backoff.async_wait([this](beast::error_code) { accept(); });
      return;
    }
    if (!ec) {
      if (connections.load() >= limits.max_connections || stopping.load()) reject(socket);
      else std::make_shared<Connection>(*this, std::move(socket))->start();
    }
    accept();
  });
}

// Past max_connections: a short 503 sent without waiting, then the socket closes.
void HttpTransport::Impl::reject(tcp::socket& socket) {
  rejected.inc();
  HttpResponse r = routes.error(503, "too many open connections (" + std::to_string(limits.max_connections) + ")",
                                "too_many_connections");
  const std::string bytes = response_head(r, r.body.size(), false, 11, "") + r.body;
  (void)::send(socket.native_handle(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  beast::error_code ec;
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

bool HttpTransport::Impl::try_start_worker() {
  std::lock_guard lock(mutex);
  if (stopping.load() || workers >= limits.max_workers) return false;
  ++workers;
  busy_workers.inc();
  return true;
}

void HttpTransport::Impl::worker_done() {
  std::lock_guard lock(mutex);
  --workers;
  busy_workers.inc(-1);
  workers_cv.notify_all();
}

HttpTransport::HttpTransport(HttpLimits limits, HttpRoutes routes, MetricsRegistry& metrics)
    : impl_(std::make_shared<Impl>(limits, std::move(routes), metrics)) {}

HttpTransport::~HttpTransport() { stop(); }

int HttpTransport::start(const std::string& host, int port) {
  Impl& s = *impl_;
  try {
    const auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host);
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
    s.acceptor.open(endpoint.protocol());
    s.acceptor.set_option(asio::socket_base::reuse_address(true));
    s.acceptor.bind(endpoint);
    s.acceptor.listen(asio::socket_base::max_listen_connections);
  } catch (const std::exception& e) {
    throw Error("cannot listen for HTTP on " + host + ":" + std::to_string(port) + ": " + e.what());
  }
  const int bound = s.acceptor.local_endpoint().port();
  s.accept();
  s.thread = std::thread([&s] {
    for (;;) {
      try {
        s.io.run();
        return;
      } catch (const std::exception& e) {  // a handler threw: log it, keep serving the others
        spdlog::error("HTTP I/O thread: {}", e.what());
      }
    }
  });
  return bound;
}

void HttpTransport::stop(milliseconds grace) {
  Impl& s = *impl_;
  if (!s.thread.joinable()) return;
  s.stopping.store(true);  // no new work; keep-alive connections close after their response
  asio::post(s.io, [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
    s.accept_backoff.cancel();
  });
  // Responses being written (the drain has already ended their generations) get a moment to
  // finish; then every connection is shut down, which fails any write still waiting.
  {
    std::unique_lock lock(s.mutex);
    s.workers_cv.wait_for(lock, std::max(grace, kStopGrace), [&s] { return s.workers == 0; });
    for (int fd : s.fds) ::shutdown(fd, SHUT_RDWR);
    s.workers_cv.wait(lock, [&s] { return s.workers == 0; });
  }
  const auto deadline = std::chrono::steady_clock::now() + kStopGrace;
  while (s.connections.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(10));
  s.io.stop();
  s.thread.join();
}

}  // namespace fathom
