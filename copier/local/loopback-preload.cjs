'use strict';
// Preloaded with `node --require ./loopback-preload.cjs main.js`: every TCP server the
// process opens (net.Server and its subclasses tls.Server, http.Server, http2 servers)
// listens on LOOPBACK_HOST (default 127.0.0.1), whatever host the program asked for.
//
// Why: kinesis-mock (npm kinesis-local) hard-codes the wildcard host "0.0.0.0"; its
// http4s Ember server, compiled by Scala.js, then calls `server.listen(port, cb)` with
// no host at all (ip4s treats 0.0.0.0 as a wildcard), which Node binds to "::", i.e.
// every IPv4 and IPv6 interface. Both its plain and its TLS server are net.Server
// instances (fs2 wraps accepted sockets in tls.TLSSocket itself), so patching
// net.Server.prototype.listen reaches both.
//
// A listen on a Unix socket path or an existing handle is left alone. A host that is
// not a loopback address is replaced, never honoured. Each bound address is reported
// on stderr as `loopback-preload: listening HOST:PORT` (stdout belongs to the program).
const net = require('net');

const HOST = process.env.LOOPBACK_HOST || '127.0.0.1';
if (!/^127\.\d+\.\d+\.\d+$/.test(HOST) && HOST !== '::1') {
  throw new Error(`loopback-preload: LOOPBACK_HOST must be a loopback address, got ${HOST}`);
}

// LOOPBACK_PORT_REWRITE="1:0": a listen on port 1 binds port 0 (an ephemeral port) instead, so a
// program that cannot be given port 0 for a server we do not want (kinesis-mock's TLS port) binds
// nothing predictable. LOOPBACK_REPORT_FD=N: also write "listening HOST:PORT requested R" lines to
// file descriptor N (a pipe the launcher reads: the real port of a server asked for port 0).
const fs = require('fs');
const REWRITE = new Map((process.env.LOOPBACK_PORT_REWRITE || '').split(',').filter(Boolean)
  .map((pair) => pair.split(':').map(Number)));
const REPORT_FD = process.env.LOOPBACK_REPORT_FD ? Number(process.env.LOOPBACK_REPORT_FD) : null;

const originalListen = net.Server.prototype.listen;

function isPort(value) {
  return typeof value === 'number' || (typeof value === 'string' && /^\d+$/.test(value));
}

net.Server.prototype.listen = function listen(...args) {
  let first = args[0];
  let requested = null;
  if (isPort(first)) {
    requested = Number(first);
    if (REWRITE.has(requested)) {
      first = args[0] = REWRITE.get(requested);
    }
    // listen(port[, host][, backlog][, callback])
    if (typeof args[1] === 'string') {
      args[1] = HOST;
    } else {
      args.splice(1, 0, HOST);
    }
  } else if (first !== null && typeof first === 'object' && !('_handle' in first) && !('fd' in first)
             && first.path === undefined) {
    // listen(options[, callback]) with a TCP port (or none: an ephemeral port)
    requested = Number(first.port || 0);
    args[0] = { ...first, host: HOST, port: REWRITE.has(requested) ? REWRITE.get(requested) : first.port };
  } else if (first === undefined || typeof first === 'function') {
    // listen([callback]): an ephemeral port on the wildcard host
    requested = 0;
    args.unshift(0, HOST);
  }
  this.once('listening', () => {
    const address = this.address();
    if (address && typeof address === 'object') {
      const line = `listening ${address.address}:${address.port} requested ${requested}\n`;
      process.stderr.write(`loopback-preload: ${line}`);
      if (REPORT_FD !== null) {
        fs.writeSync(REPORT_FD, line);
      }
    }
  });
  return originalListen.apply(this, args);
};

// LOOPBACK_EXIT_WITH_STDIN=1: exit when stdin reaches EOF, i.e. when the parent that holds the
// other end of a stdin pipe dies (even by SIGKILL), so a crashed test run leaves no server behind.
// SIGKILL itself, not process.exit(): measured, kinesis-mock lived on after process.exit(0) for as long as a
// client kept a connection to it open (its runtime's shutdown waits for them); the servers keep everything
// in memory, so nothing is lost by dying at once.
if (process.env.LOOPBACK_EXIT_WITH_STDIN === '1') {
  const die = () => process.kill(process.pid, 'SIGKILL');
  process.stdin.on('end', die);
  process.stdin.on('error', die);
  process.stdin.resume();
}
