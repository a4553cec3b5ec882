/* SPDX-License-Identifier: MIT */
#include "fanout.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define PROGRESS_INTERVAL_S 0.2

struct job {
	size_t index;
	CURL *easy;
	char *body;          /* response bytes read so far */
	size_t body_len;
	bool too_large;
	/* An attempt sent its request and got no answer (timed out, cut): the
	 * server may still be running that transition, so a 409 busy on the
	 * next attempt is most likely our own and worth waiting out. */
	bool sent_unanswered;
	double first_start_s;
	double due_s;        /* when the next attempt may start */
	char curl_error[CURL_ERROR_SIZE];
};

struct fanout {
	const struct ctl_endpoints *endpoints;
	const struct ctl_run_options *o;
	const struct ctl_command_info *command;
	struct ctl_result *results;
	struct job *jobs;
	size_t *waiting_list; /* indices of jobs between attempts */
	CURLM *multi;
	struct curl_slist *headers;
	uint64_t random_state;
	size_t next;         /* first job never started */
	size_t active;
	size_t waiting;
	size_t finished;
	size_t failed;
	double progress_at_s;
	bool progress_drawn;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* xorshift64*: jitter only, so quality beyond "not in lockstep" is moot. */
static double random01(struct fanout *f)
{
	uint64_t x = f->random_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	f->random_state = x;
	return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *userdata)
{
	struct job *job = userdata;
	size_t len = size * nmemb;
	char *grown;

	if (len > CTL_RESPONSE_MAX - job->body_len) {
		job->too_large = true;
		return 0; /* makes curl fail the transfer with CURLE_WRITE_ERROR */
	}
	grown = realloc(job->body, job->body_len + len + 1);
	if (!grown)
		return 0;
	memcpy(grown + job->body_len, data, len);
	job->body = grown;
	job->body_len += len;
	job->body[job->body_len] = '\0';
	return len;
}

/* Connection-level failures worth another attempt: the server may be
 * starting, restarting or briefly overloaded. Transitions are idempotent
 * (asking for the state a tag is in changes nothing), so resending is safe. */
static bool curl_code_retryable(CURLcode code)
{
	switch (code) {
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_CONNECT:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
		return true;
	default:
		return false;
	}
}

static int job_start(struct fanout *f, struct job *job, char *err, size_t err_size)
{
	const struct ctl_endpoint *e = &f->endpoints->items[job->index];
	char url[CTL_SPEC_MAX + 64];
	CURL *easy = curl_easy_init();

	if (!easy) {
		snprintf(err, err_size, "curl_easy_init failed");
		return -ENOMEM;
	}
	snprintf(url, sizeof(url), "%s%s", e->base_url, f->command->path);
	free(job->body);
	job->body = NULL;
	job->body_len = 0;
	job->too_large = false;
	job->curl_error[0] = '\0';

	curl_easy_setopt(easy, CURLOPT_URL, url);
	if (e->unix_path)
		curl_easy_setopt(easy, CURLOPT_UNIX_SOCKET_PATH, e->unix_path);
	curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, f->o->timeout_ms);
	curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, f->o->connect_timeout_ms);
	curl_easy_setopt(easy, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)CTL_RESPONSE_MAX);
	curl_easy_setopt(easy, CURLOPT_HTTPHEADER, f->headers);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, job);
	curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, job->curl_error);
	curl_easy_setopt(easy, CURLOPT_PRIVATE, job);
	if (strcmp(f->command->method, "POST") == 0) {
		const char *body = f->o->body ? f->o->body : "";

		curl_easy_setopt(easy, CURLOPT_POST, 1L);
		curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
		curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
	}
	if (curl_multi_add_handle(f->multi, easy) != CURLM_OK) {
		curl_easy_cleanup(easy);
		snprintf(err, err_size, "curl_multi_add_handle failed");
		return -ENOMEM;
	}
	job->easy = easy;
	if (job->first_start_s == 0)
		job->first_start_s = now_s();
	f->active++;
	return 0;
}

static void job_finish(struct fanout *f, struct job *job)
{
	struct ctl_result *r = &f->results[job->index];

	r->elapsed_s = now_s() - job->first_start_s;
	if (!r->ok && r->attempts > 1) {
		size_t len = strlen(r->error);

		snprintf(r->error + len, sizeof(r->error) - len, " (%u attempts)", r->attempts);
	}
	free(job->body);
	job->body = NULL;
	f->finished++;
	if (!r->ok)
		f->failed++;
}

static void job_schedule_retry(struct fanout *f, struct job *job, double retry_after_s)
{
	unsigned attempt = f->results[job->index].attempts;

	job->due_s = now_s() + ctl_retry_delay_s(&f->o->retry, attempt, retry_after_s, random01(f));
	f->waiting_list[f->waiting++] = job->index;
}

/* One attempt ended: read it, then retry or finish the job. */
static void job_done(struct fanout *f, struct job *job, CURLcode code)
{
	struct ctl_result *r = &f->results[job->index];
	unsigned attempts;
	bool may_retry;
	long status = 0;
	curl_off_t retry_after = 0;
	char *content_type = NULL;

	/* Each attempt's outcome replaces the last one's whole. */
	attempts = r->attempts + 1;
	ctl_result_finish(r);
	ctl_result_init(r);
	r->attempts = attempts;
	may_retry = attempts <= f->o->retry.retries;
	curl_easy_getinfo(job->easy, CURLINFO_RESPONSE_CODE, &status);
	if (code == CURLE_OK) {
		curl_easy_getinfo(job->easy, CURLINFO_CONTENT_TYPE, &content_type);
		curl_easy_getinfo(job->easy, CURLINFO_RETRY_AFTER, &retry_after);
		ctl_result_from_response(r, f->o->command, status, content_type, job->body,
					 job->body_len, f->o->keep_responses);
		if (!r->ok && may_retry &&
		    (ctl_status_retryable(status) || (status == 409 && job->sent_unanswered))) {
			job_schedule_retry(f, job, retry_after > 0 ? (double)retry_after : -1);
			goto out;
		}
	} else {
		long os_errno = 0, request_bytes = 0;

		r->ok = false;
		r->http_status = status;
		curl_easy_getinfo(job->easy, CURLINFO_OS_ERRNO, &os_errno);
		curl_easy_getinfo(job->easy, CURLINFO_REQUEST_SIZE, &request_bytes);
		if (request_bytes > 0 && f->command->transition)
			job->sent_unanswered = true;
		if (code == CURLE_FILESIZE_EXCEEDED) /* told by Content-Length */
			job->too_large = true;
		if (job->too_large)
			snprintf(r->error, sizeof(r->error), "response larger than %d bytes",
				 CTL_RESPONSE_MAX);
		else if (code == CURLE_COULDNT_CONNECT && os_errno > 0)
			/* curl's own text names "localhost port 80" for a socket */
			snprintf(r->error, sizeof(r->error), "cannot connect: %s",
				 strerror((int)os_errno));
		else
			snprintf(r->error, sizeof(r->error), "%s",
				 job->curl_error[0] ? job->curl_error : curl_easy_strerror(code));
		if (!job->too_large && curl_code_retryable(code) && may_retry) {
			job_schedule_retry(f, job, -1);
			goto out;
		}
	}
	job_finish(f, job);
out:
	curl_multi_remove_handle(f->multi, job->easy);
	curl_easy_cleanup(job->easy);
	job->easy = NULL;
	f->active--;
}

static void progress_draw(struct fanout *f, bool force)
{
	double t = now_s();

	if (!f->o->progress || (!force && t - f->progress_at_s < PROGRESS_INTERVAL_S))
		return;
	f->progress_at_s = t;
	fprintf(stderr, "\r\033[Kdormantctl: %s %zu/%zu done, %zu failed, %zu in flight, %zu to retry",
		f->command->name, f->finished, f->endpoints->count, f->failed, f->active, f->waiting);
	fflush(stderr);
	f->progress_drawn = true;
}

static void progress_clear(struct fanout *f)
{
	if (f->progress_drawn) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
	}
}

/* Start due retries first (they have waited), then endpoints never tried. */
static int start_jobs(struct fanout *f, char *err, size_t err_size)
{
	double t = now_s();
	int r;

	for (size_t i = 0; i < f->waiting && f->active < f->o->concurrency;) {
		struct job *job = &f->jobs[f->waiting_list[i]];

		if (job->due_s > t) {
			i++;
			continue;
		}
		f->waiting_list[i] = f->waiting_list[--f->waiting];
		r = job_start(f, job, err, err_size);
		if (r < 0)
			return r;
	}
	while (f->next < f->endpoints->count && f->active < f->o->concurrency) {
		r = job_start(f, &f->jobs[f->next], err, err_size);
		if (r < 0)
			return r;
		f->next++;
	}
	return 0;
}

/* How long to wait for sockets: until the next retry is due, and often
 * enough to keep the progress line moving. */
static int poll_timeout_ms(struct fanout *f)
{
	double t = now_s(), wait_s = 1.0;

	if (f->o->progress)
		wait_s = PROGRESS_INTERVAL_S;
	if (f->active >= f->o->concurrency)
		return (int)(wait_s * 1000); /* only a transfer ending frees a slot */
	if (f->next < f->endpoints->count)
		return 0; /* room to start more now */
	for (size_t i = 0; i < f->waiting; i++)
		if (f->jobs[f->waiting_list[i]].due_s - t < wait_s)
			wait_s = f->jobs[f->waiting_list[i]].due_s - t;
	return wait_s <= 0 ? 0 : (int)(wait_s * 1000) + 1;
}

static uint64_t random_seed(void)
{
	uint64_t seed = 0;
	struct timespec ts;

	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed) || seed == 0) {
		clock_gettime(CLOCK_REALTIME, &ts);
		seed = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid();
	}
	return seed ? seed : 0x9E3779B97F4A7C15ull;
}

static int headers_build(struct fanout *f, char *err, size_t err_size)
{
	struct curl_slist *list = NULL, *next;
	char authorization[4200];
	const char *lines[4] = { "Accept: application/json", "Expect:", NULL, NULL };

	if (strcmp(f->command->method, "POST") == 0)
		/* No body means "every tag"; a body is JSON. An empty value makes
		 * curl drop its default form content type. */
		lines[2] = f->o->body ? "Content-Type: application/json" : "Content-Type:";
	for (size_t i = 0; i < 4 && lines[i]; i++) {
		next = curl_slist_append(list, lines[i]);
		if (!next)
			goto oom;
		list = next;
	}
	if (f->o->token) {
		if ((size_t)snprintf(authorization, sizeof(authorization), "Authorization: Bearer %s",
				     f->o->token) >= sizeof(authorization)) {
			curl_slist_free_all(list);
			snprintf(err, err_size, "token too long");
			return -EINVAL;
		}
		next = curl_slist_append(list, authorization);
		explicit_bzero(authorization, sizeof(authorization));
		if (!next)
			goto oom;
		list = next;
	}
	f->headers = list;
	return 0;
oom:
	curl_slist_free_all(list);
	snprintf(err, err_size, "out of memory");
	return -ENOMEM;
}

int ctl_run(const struct ctl_endpoints *endpoints, const struct ctl_run_options *o,
	    struct ctl_result *results, char *err, size_t err_size)
{
	struct fanout f = {
		.endpoints = endpoints,
		.o = o,
		.command = ctl_command_info(o->command),
		.results = results,
	};
	int r;

	if (!f.command || o->concurrency == 0 || o->concurrency > CTL_CONCURRENCY_MAX) {
		snprintf(err, err_size, "bad run options");
		return -EINVAL;
	}
	f.random_state = random_seed();
	f.jobs = calloc(endpoints->count ? endpoints->count : 1, sizeof(*f.jobs));
	f.waiting_list = calloc(endpoints->count ? endpoints->count : 1, sizeof(*f.waiting_list));
	f.multi = curl_multi_init();
	if (!f.jobs || !f.waiting_list || !f.multi) {
		snprintf(err, err_size, "out of memory");
		r = -ENOMEM;
		goto out;
	}
	r = headers_build(&f, err, err_size);
	if (r < 0)
		goto out;
	for (size_t i = 0; i < endpoints->count; i++)
		f.jobs[i].index = i;

	while (f.finished < endpoints->count) {
		int running = 0;
		CURLMsg *msg;
		int left;

		r = start_jobs(&f, err, err_size);
		if (r < 0)
			goto out;
		if (curl_multi_perform(f.multi, &running) != CURLM_OK) {
			snprintf(err, err_size, "curl_multi_perform failed");
			r = -EIO;
			goto out;
		}
		while ((msg = curl_multi_info_read(f.multi, &left))) {
			char *job = NULL;

			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &job);
			job_done(&f, (struct job *)(void *)job, msg->data.result);
		}
		progress_draw(&f, false);
		if (f.finished == endpoints->count)
			break;
		curl_multi_poll(f.multi, NULL, 0, poll_timeout_ms(&f), NULL);
	}
	r = (int)f.failed;
out:
	progress_clear(&f);
	for (size_t i = 0; f.jobs && i < endpoints->count; i++) {
		if (f.jobs[i].easy) {
			curl_multi_remove_handle(f.multi, f.jobs[i].easy);
			curl_easy_cleanup(f.jobs[i].easy);
		}
		free(f.jobs[i].body);
	}
	curl_multi_cleanup(f.multi);
	curl_slist_free_all(f.headers);
	free(f.waiting_list);
	free(f.jobs);
	return r;
}
