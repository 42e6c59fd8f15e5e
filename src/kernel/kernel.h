/*
** kernel.h — the plain-C half of the Jupyter kernel: the connection file,
** the wire format with its HMAC-SHA256 signatures (wire.c), and the
** kernelspec (install.c). The Lua half is src/lua/lkernel.c.
*/
#ifndef MG_KERNEL_H
#define MG_KERNEL_H

#include <stddef.h>
#include <cjson/cJSON.h>

/* what the connection file says */
typedef struct mg_kconn {
  char transport[8];            /* "tcp" or "ipc" */
  char ip[256];                 /* an address for tcp, a path prefix for ipc */
  char key[512];                /* the HMAC key; empty: messages are not signed */
  int  port[5];                 /* shell, iopub, stdin, control, hb */
} mg_kconn;

enum { MG_KSHELL, MG_KIOPUB, MG_KSTDIN, MG_KCONTROL, MG_KHB };

/* reads path; 0, or -1 with the reason in err */
int  mg_kconn_read (const char *path, mg_kconn *c, char *err, size_t errlen);
/* the endpoint of socket which, as zmq_bind wants it */
void mg_kconn_endpoint (const mg_kconn *c, int which, char *buf, size_t n);

/* a message as received: the routing identities, and its four JSON parts */
typedef struct mg_kmsg {
  void  **ids;
  size_t *idlen;
  int     nids;
  cJSON  *header, *parent, *metadata, *content;
} mg_kmsg;

/*
** Receives one message from sock. 1: m holds it; 0: it was dropped (a bad
** or missing signature, broken JSON: logged, nothing else done); -1: no
** message (EINTR, EAGAIN, the context ended).
*/
int  mg_kmsg_recv (void *sock, const char *key, mg_kmsg *m);
void mg_kmsg_free (mg_kmsg *m);
/* the msg_type of m's header ("" if none) */
const char *mg_kmsg_type (const mg_kmsg *m);

/*
** Sends a message of msg_type with content (taken: freed here) as a reply
** to parent (its header; NULL for none) to the identities of to (NULL: to
** the topic msg_type, for iopub); session is the kernel's. 0 or -1.
*/
int  mg_kmsg_send (void *sock, const char *key, const char *session, const mg_kmsg *to,
                   const cJSON *parent, const char *msg_type, cJSON *content);

/* s[0..n) as a JSON string of valid UTF-8 (a client drops a message that is
** not): a byte that starts no valid character, or a NUL, becomes U+FFFD */
cJSON *mg_ktext (const char *s, size_t n);

/* output.c: fds 1 and 2 as pipes, read by a thread that hands what comes to
** fn(ud, "stdout" or "stderr", text, n) */
typedef struct mg_kout mg_kout;
typedef void (*mg_kout_fn) (void *ud, const char *name, const char *text, size_t n);
/* redirects and starts reading (stdin from /dev/null too); *origerr: a dup of
** the stderr there was; NULL when it could not (errno set) */
mg_kout *mg_kout_start (mg_kout_fn fn, void *ud, int *origerr);
/* flushes, and returns once everything written so far is handed over */
void mg_kout_sync (mg_kout *o);
/* hands over the rest, restores fds 1 and 2, ends the thread */
void mg_kout_stop (mg_kout *o);

/* a fresh random UUID (36 characters and a NUL) */
void mg_kuuid (char out[37]);
/* base64 of data, malloc'd (NULL when out of memory) */
char *mg_kbase64 (const void *data, size_t n);
/* the kernel's log (the stderr Jupyter was given, not the notebook's) */
void mg_klog (const char *fmt, ...);
void mg_klog_to (int fd);

/* moongrad --install-kernel [--user] [--prefix P]: the kernelspec */
int  mg_kernel_install (int argc, char **argv);

#endif
