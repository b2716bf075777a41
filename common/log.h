/* Logging with levels to stderr. The level comes from mp_log_set_level or, at first use,
 * from $MESHPLAN_LOG (error|warn|info|debug). Default: warn. */
#ifndef MP_COMMON_LOG_H
#define MP_COMMON_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MP_LOG_ERROR = 0, MP_LOG_WARN, MP_LOG_INFO, MP_LOG_DEBUG } mp_log_level;

void mp_log_set_level(mp_log_level level);
mp_log_level mp_log_get_level(void);
void mp_log(mp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define MP_LOGE(...) mp_log(MP_LOG_ERROR, __VA_ARGS__)
#define MP_LOGW(...) mp_log(MP_LOG_WARN, __VA_ARGS__)
#define MP_LOGI(...) mp_log(MP_LOG_INFO, __VA_ARGS__)
#define MP_LOGD(...) mp_log(MP_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
